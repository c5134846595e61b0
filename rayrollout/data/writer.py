"""Streaming output: trajectories go to Parquet or JSONL part files while the run goes on.

Sinks share one lifecycle (``start``, ``write``, ``complete``, ``failed``); ``PartWriter``
cuts rows into parts, so memory is bounded by ``rows_per_part``. The folder itself (names,
temporary files, the lock, what is written) is ``RunFolder``'s.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from rayrollout.data.run_folder import FORMATS, SCHEMA, RunFolder, WriterError
from rayrollout.data.schema import inline_images
from rayrollout.figures import WriterFigures

__all__ = [
    "SCHEMA",
    "JsonlSink",
    "ParquetSink",
    "PartSink",
    "PartWriter",
    "Sink",
    "WriterError",
    "WriterFigures",
    "make_sink",
]


class Sink(Protocol):
    """Where finished rows go. ``write`` gets one part's rows and must leave it whole or absent."""

    def start(self) -> None: ...
    def write(self, table: pa.Table) -> Path: ...
    def complete(self) -> None: ...
    def failed(self, error: BaseException) -> None: ...


class PartSink:
    """A sink writing one part file per ``write`` into a ``RunFolder``: the engine's, holding
    the folder's lock, or a worker's (``writer`` names it, ``holder_pid`` is the engine whose
    lock its parts are written under, see ``RunFolder.fenced``)."""

    format = ""

    def __init__(
        self,
        directory: str | Path | RunFolder,
        run_id: str,
        lock_timeout_s: float = 60.0,
        writer: str | None = None,
        holder_pid: int | None = None,
    ) -> None:
        self.folder = (
            directory if isinstance(directory, RunFolder) else RunFolder(directory, self.format)
        )
        self.directory = self.folder.path
        self.run_id = run_id
        self.lock_timeout_s = lock_timeout_s
        self.writer = writer
        self.holder_pid = holder_pid
        self.parts_written = 0

    def start(self) -> None:
        """Create the folder, become its one writer, and clear half-written parts of runs
        that were killed (never renamed, so never read). A worker's sink takes no lock: it
        clears its own half-written parts (a killed process of the same worker's) and
        numbers its parts on from those already there."""
        self.folder.create()
        if self.writer is not None:
            self.folder.remove_temporaries(self.run_id, self.writer)
            earlier = self.folder.writer_parts(self.run_id, self.writer)
            self.parts_written = 1 + max(
                (int(p.stem.rsplit(".", 1)[1]) for p in earlier), default=-1
            )
            return
        self.folder.take_lock(self.lock_timeout_s)
        self.folder.remove_temporaries()

    def write(self, table: pa.Table) -> Path:
        def write_part() -> Path:
            return self.folder.write_part(
                self.run_id,
                self.parts_written,
                lambda temporary: self._write_file(table, temporary),
                self.format,
                self.writer,
            )

        if self.holder_pid is None:
            path = write_part()
        else:
            with self.folder.fenced(self.holder_pid):
                path = write_part()
        self.parts_written += 1
        return path

    def _write_file(self, table: pa.Table, path: Path) -> None:
        raise NotImplementedError

    def complete(self) -> None:
        """Every part is complete once renamed; only the folder lock is left to release."""
        self.folder.release_lock()

    def failed(self, error: BaseException) -> None:
        self.folder.remove_temporaries(self.run_id)
        self.folder.release_lock()


class ParquetSink(PartSink):
    format = "parquet"

    def _write_file(self, table: pa.Table, path: Path) -> None:
        pq.write_table(table, path, compression="zstd")


class JsonlSink(PartSink):
    format = "jsonl"

    def _write_file(self, table: pa.Table, path: Path) -> None:
        with path.open("w", encoding="utf-8") as file:
            for row in table.to_pylist():
                row = inline_images(row)  # JSONL keeps each image as a data URL in its parts
                file.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
            file.flush()
            os.fsync(file.fileno())


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} to JSONL")


def make_sink(
    directory: str | Path | RunFolder,
    fmt: str,
    run_id: str,
    writer: str | None = None,
    holder_pid: int | None = None,
) -> PartSink:
    """The sink for an output format name, writing into ``directory`` (a path or the
    engine's ``RunFolder``); ``writer`` and ``holder_pid`` make a worker's (``PartSink``)."""
    sinks: dict[str, type[PartSink]] = {"parquet": ParquetSink, "jsonl": JsonlSink}
    if fmt not in sinks:
        raise WriterError(f"unknown output format {fmt!r}; use one of {', '.join(FORMATS)}")
    return sinks[fmt](directory, run_id, writer=writer, holder_pid=holder_pid)


class PartWriter:
    """Buffers rows and hands the sink one part at a time (by size or by age)."""

    def __init__(self, sink: Sink, rows_per_part: int, flush_interval_s: float) -> None:
        self.sink = sink
        self.rows_per_part = rows_per_part
        self.flush_interval_s = flush_interval_s
        self.buffer: list[pa.Table] = []
        self.buffered_rows = 0
        self.rows_written = 0
        self.paths: list[Path] = []
        self.last_flush = time.monotonic()
        self.seconds_writing = 0.0  # encoding and writing parts (in the engine's threads)

    def add(self, rows: list[dict[str, Any]] | pa.Table) -> list[pa.Table]:
        """Buffer rows (dicts, or a table of ``SCHEMA``); return the tables now due to be
        written (possibly none)."""
        # No rows (the engine's flush timer) builds no table: an empty table of the schema
        # costs more than a report, and the first one imports pandas (a fifth of a second).
        if isinstance(rows, list):
            table = pa.Table.from_pylist(rows, schema=SCHEMA) if rows else None
        else:
            table = rows
        if table is not None and table.num_rows:
            self.buffer.append(table)
            self.buffered_rows += table.num_rows
        due = []
        while self.buffered_rows >= self.rows_per_part:
            due.append(self._take(self.rows_per_part))
        if self.buffered_rows and time.monotonic() - self.last_flush >= self.flush_interval_s:
            due.append(self._take(self.buffered_rows))
        return due

    def drain(self) -> list[pa.Table]:
        """Everything still buffered, as one final table (or nothing)."""
        return [self._take(self.buffered_rows)] if self.buffered_rows else []

    def _take(self, n: int) -> pa.Table:
        table = pa.concat_tables(self.buffer)
        head, rest = table.slice(0, n), table.slice(n)
        self.buffer = [rest] if rest.num_rows else []
        self.buffered_rows = rest.num_rows
        self.last_flush = time.monotonic()
        return head.combine_chunks()

    def write(self, table: pa.Table) -> Path:
        started = time.perf_counter()
        path = self.sink.write(table)
        self.seconds_writing += time.perf_counter() - started
        self.rows_written += table.num_rows
        self.paths.append(path)
        return path

    def figures(self) -> WriterFigures:
        """Parts and rows written so far, and the seconds spent writing them."""
        return WriterFigures(
            parts=len(self.paths),
            rows=self.rows_written,
            buffered_rows=self.buffered_rows,
            seconds=self.seconds_writing,
        )
