"""Streaming output: trajectories go to Parquet or JSONL part files while the run goes on.

Each part is written to a hidden temporary file and renamed into place, so a reader (or a
resumed run) never sees half a part: ``pyarrow.dataset``, pandas and Ray Data skip names
starting with ``.``. Part names carry the run id, so a resumed run adds parts beside the old
ones. Memory is bounded by ``rows_per_part``.

Sinks follow one lifecycle (``start``, ``write``, ``complete``, ``failed``); Parquet and JSONL
are two implementations of it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from rayrollout.data.schema import trajectory_arrow_schema

__all__ = [
    "JsonlSink",
    "ParquetSink",
    "PartWriter",
    "Sink",
    "WriterError",
    "make_sink",
    "written_keys",
]

SCHEMA = trajectory_arrow_schema()


class WriterError(RuntimeError):
    """Output could not be written (disk full, permissions, a bad folder)."""


class Sink(Protocol):
    """Where finished rows go. ``write`` gets one part's rows and must leave it whole or absent."""

    def start(self) -> None: ...
    def write(self, table: pa.Table) -> Path: ...
    def complete(self) -> None: ...
    def failed(self, error: BaseException) -> None: ...


class _PartSink:
    suffix = ""

    def __init__(self, directory: str | Path, run_id: str, lock_timeout_s: float = 60.0) -> None:
        self.directory = Path(directory)
        self.run_id = run_id
        self.lock_timeout_s = lock_timeout_s
        self.parts_written = 0
        self._lock: Any = None

    def start(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriterError(f"cannot create output folder {self.directory}: {exc}") from exc
        self._take_lock()
        for stale in self.directory.glob(f".part-*{self.suffix}.tmp"):
            stale.unlink(missing_ok=True)  # left by a killed run; never renamed, so never read

    def write(self, table: pa.Table) -> Path:
        name = f"part-{self.run_id}-{self.parts_written:05d}{self.suffix}"
        final = self.directory / name
        temporary = self.directory / f".{name}.tmp"
        try:
            self._write_file(table, temporary)
            os.replace(temporary, final)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise WriterError(f"cannot write {final}: {exc}") from exc
        self.parts_written += 1
        return final

    def _write_file(self, table: pa.Table, path: Path) -> None:
        raise NotImplementedError

    def _take_lock(self) -> None:
        """One writer per folder: a killed run's orphaned writer must be gone before
        a resumed run reads which rows exist, or both would write the same rows.
        The OS drops the lock when the holding process dies."""
        lock = (self.directory / ".lock").open("a")
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lock = lock
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    lock.close()
                    raise WriterError(
                        f"another run is still writing to {self.directory} (it holds "
                        f"{self.directory / '.lock'}); stop it, or use another --out"
                    ) from None
                time.sleep(0.2)

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def complete(self) -> None:
        """Every part is complete once renamed; only the folder lock is left to release."""
        self._release_lock()

    def failed(self, error: BaseException) -> None:
        for stale in self.directory.glob(f".part-{self.run_id}-*.tmp"):
            stale.unlink(missing_ok=True)
        self._release_lock()


class ParquetSink(_PartSink):
    suffix = ".parquet"

    def _write_file(self, table: pa.Table, path: Path) -> None:
        pq.write_table(table, path, compression="zstd")


class JsonlSink(_PartSink):
    suffix = ".jsonl"

    def _write_file(self, table: pa.Table, path: Path) -> None:
        with path.open("w", encoding="utf-8") as file:
            for row in table.to_pylist():
                file.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
            file.flush()
            os.fsync(file.fileno())


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} to JSONL")


def make_sink(directory: str | Path, fmt: str, run_id: str) -> Sink:
    """The sink for an output format name."""
    sinks = {"parquet": ParquetSink, "jsonl": JsonlSink}
    if fmt not in sinks:
        raise WriterError(f"unknown output format {fmt!r}; use one of {', '.join(sinks)}")
    return sinks[fmt](directory, run_id)


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
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=SCHEMA)
        if table.num_rows:
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

    def figures(self) -> dict[str, Any]:
        """Parts and rows written so far, and the seconds spent writing them."""
        return {
            "parts": len(self.paths),
            "rows": self.rows_written,
            "buffered_rows": self.buffered_rows,
            "seconds": self.seconds_writing,
        }


def written_keys(directory: str | Path, fmt: str) -> set[tuple[str, int]]:
    """Every ``(task_id, sample_index)`` already written in an output folder (for --resume)."""
    directory = Path(directory)
    if not directory.exists():
        return set()
    keys: set[tuple[str, int]] = set()
    if fmt == "parquet":
        files = sorted(str(p) for p in directory.glob("part-*.parquet"))
        if not files:
            return keys
        dataset = ds.dataset(files, format="parquet")
        for batch in dataset.to_batches(columns=["task_id", "sample_index"]):
            keys.update(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True))
        return keys
    for path in sorted(directory.glob("part-*.jsonl")):
        with path.open(encoding="utf-8") as file:
            for line in file:
                if line.strip():
                    row = json.loads(line)
                    keys.add((row["task_id"], row["sample_index"]))
    return keys
