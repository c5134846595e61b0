"""Writing an export: JSONL lines, or Parquet row groups with a fixed schema per kind (a
schema inferred per batch could change between batches, e.g. 'tools' all null in one).

The caller writes to temporary files and renames them into place (``run.export_run``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["SCHEMAS", "write_rows", "write_routed"]

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
    """Write rows to ``path`` as ``suffix`` says; return how many."""
    written = 0
    if suffix == ".jsonl" or schema is None:
        with path.open("w", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
                written += 1
        return written
    # Message lists are built as lists of JSON text, then cast to the JSON extension type.
    text_lists = [f.name for f in schema if f.type == _MESSAGES]
    storage = pa.schema(
        [f.with_type(pa.list_(_TEXT)) if f.name in text_lists else f for f in schema]
    )
    batch: list[dict[str, Any]] = []
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for row in rows:
            for name in text_lists:
                row[name] = [json.dumps(m, ensure_ascii=False) for m in row[name]]
            batch.append(row)
            if len(batch) >= _BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=storage).cast(schema))
                written, batch = written + len(batch), []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=storage).cast(schema))
            written += len(batch)
    return written
