"""Writing an export: JSONL lines, or Parquet row groups with a fixed schema per kind.

An ``sft`` or ``dpo`` export whose rows show images gets an ``images`` column that
``datasets`` decodes for TRL's vision collators; a text-only one has none. A row with images
after rows written without it raises ``LateImages``, and the caller writes again with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from rayrollout.data.errors import LateImages
from rayrollout.data.images import decode_data_url

__all__ = ["SCHEMAS", "LateImages", "with_images", "write_rows", "write_routed"]

_BATCH = 256

_TEXT, _INT, _FLOAT = pa.string(), pa.int64(), pa.float64()
_MESSAGES = pa.list_(pa.json_())  # Arrow's canonical JSON type: datasets reads List(Json)
SCHEMAS: dict[str, pa.Schema] = {
    "sft": pa.schema(
        [
            ("messages", _MESSAGES),
            ("tools", _TEXT),
            ("task_id", _TEXT),
            ("sample_index", _INT),
            ("reward", _FLOAT),
        ]
    ),
    "dpo": pa.schema(
        [
            ("prompt", _MESSAGES),
            ("chosen", _MESSAGES),
            ("rejected", _MESSAGES),
            ("tools", _TEXT),
            ("task_id", _TEXT),
            ("chosen_sample_index", _INT),
            ("rejected_sample_index", _INT),
            ("chosen_reward", _FLOAT),
            ("rejected_reward", _FLOAT),
        ]
    ),
    "verl": pa.schema(
        [
            ("data_source", _TEXT),
            ("prompt", pa.list_(pa.struct([("role", _TEXT), ("content", _TEXT)]))),
            ("ability", _TEXT),
            ("reward_model", pa.struct([("style", _TEXT), ("ground_truth", _TEXT)])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", _INT),
                        ("task_id", _TEXT),
                        ("environment", _TEXT),
                        ("samples", _INT),
                        ("mean_reward", _FLOAT),
                        ("tools", _TEXT),
                        ("fields", _TEXT),
                    ]
                ),
            ),
        ]
    ),
}


_IMAGES = pa.list_(pa.struct([("bytes", pa.binary()), ("path", _TEXT)]))
# What datasets writes for a List(Image()) column; the other columns' types it reads from Arrow.
_IMAGES_FEATURES = {"images": {"feature": {"_type": "Image"}, "_type": "List"}}


def with_images(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the ``images`` column and the metadata that makes it images."""
    metadata = {b"huggingface": json.dumps({"info": {"features": _IMAGES_FEATURES}}).encode()}
    return schema.append(pa.field("images", _IMAGES)).with_metadata(metadata)


def write_routed(
    rows: Iterator[tuple[str, dict[str, Any]]], paths: dict[str, Path]
) -> dict[str, int]:
    """Write each (file, row) as a JSONL line of ``paths[file]``; return the rows per file.

    Every file is created, empty or not: NeMo Gym's collection leaves an empty failures
    file when nothing failed, and its tools read the files by name.
    """
    written = dict.fromkeys(paths, 0)
    files: dict[str, TextIO] = {}
    try:
        for name, path in paths.items():
            files[name] = path.open("w", encoding="utf-8")
        for name, row in rows:
            files[name].write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            written[name] += 1
    finally:
        for file in files.values():
            file.close()
    return written


def write_rows(
    rows: Iterator[dict[str, Any]], path: Path, suffix: str, schema: pa.Schema | None
) -> int:
    """Write rows to ``path`` as ``suffix`` says; return how many.

    Parquet: ``schema`` gains the ``images`` column when the first batch shows images (or
    has it already); raises ``LateImages`` when a later batch shows images and it has not.
    """
    written = 0
    if suffix == ".jsonl" or schema is None:
        with path.open("w", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
                written += 1
        return written
    # Message lists are built as lists of JSON text, then cast to the JSON extension type.
    text_lists = [f.name for f in schema if f.type == _MESSAGES]
    batch: list[dict[str, Any]] = []
    writer: pq.ParquetWriter | None = None
    try:
        for row in rows:
            for name in text_lists:
                row[name] = [json.dumps(m, ensure_ascii=False) for m in row[name]]
            batch.append(row)
            if len(batch) >= _BATCH:
                writer = _write_batch(writer, path, schema, batch)
                written, batch = written + len(batch), []
        if batch or writer is None:
            writer = _write_batch(writer, path, schema, batch)
            written += len(batch)
    finally:
        if writer is not None:
            writer.close()
    return written


def _write_batch(
    writer: pq.ParquetWriter | None, path: Path, schema: pa.Schema, batch: list[dict[str, Any]]
) -> pq.ParquetWriter:
    """Write ``batch``, opening the file first if ``writer`` is None; return the writer."""
    shows = any("images" in row for row in batch)
    if writer is None:
        if shows and "images" not in schema.names:
            schema = with_images(schema)
        writer = pq.ParquetWriter(path, schema, compression="zstd")
    elif shows and "images" not in writer.schema.names:
        raise LateImages("a row shows images after rows written without an 'images' column")
    schema = writer.schema
    if "images" in schema.names:
        for row in batch:
            row["images"] = [
                {"bytes": decode_data_url(url)[1], "path": None} for url in row.get("images", [])
            ]
    storage = pa.schema(
        [f.with_type(pa.list_(_TEXT)) if f.type == _MESSAGES else f for f in schema]
    )
    writer.write_table(pa.Table.from_pylist(batch, schema=storage).cast(schema))
    return writer
