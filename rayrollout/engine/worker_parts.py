"""A worker's own part files: the rows it plays go from it to storage, not through the engine.

Rows wait in the worker until ``rows_per_part`` of them are there or ``flush_interval_s``
has passed since the first, then go to one part, written whole inside the folder's commit
fence (``RunFolder.fenced``: only while the engine that sent the episodes holds the folder's
lock). Each of the engine's sessions keeps a ``ChunkCommits``: which of its episodes a renamed
part holds, what the engine is told, so that it sends again only episodes whose rows are in no
part.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from rayrollout.data.run_folder import SCHEMA, RunFolder
from rayrollout.data.writer import make_sink

__all__ = ["ChunkCommits", "Finished", "PartsTarget", "WorkerParts"]

_ROW_TYPE = pa.struct(SCHEMA)
CONVERT_ROWS = 64
"""Rows converted to Arrow together: a few milliseconds of the worker's loop at a time."""


@dataclass(frozen=True)
class PartsTarget:
    """Where a worker writes the rows of a chunk: the engine's folder and run, and the
    engine's process, whose hold on the folder's lock every part is written under. Only a
    worker on the engine's node (``node_id``) writes: the folder is the engine's node's,
    and the lock a process of that node's; a worker elsewhere sends its rows back."""

    directory: str
    fmt: str
    run_id: str
    holder_pid: int
    rows_per_part: int
    flush_interval_s: float
    node_id: str


@dataclass
class ChunkCommits:
    """The episodes of one session (or call) whose rows this worker writes, as parts take
    them."""

    waiting: int = 0  # rows of the call in the buffer or in a part being written
    committed: list[int] = field(default_factory=list)  # indices in renamed parts, not yet told
    parts: list[str] = field(default_factory=list)  # those parts, not yet told
    seconds: float = 0.0  # spent writing those parts (each part's told to one call only)
    error: BaseException | None = None  # a part of the call's rows could not be written
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self) -> tuple[list[int], list[str], float]:
        """The indices committed, the parts written and the seconds spent writing them,
        since the last take."""
        committed, parts, seconds = self.committed, self.parts, self.seconds
        self.committed, self.parts, self.seconds = [], [], 0.0
        self.changed.clear()
        return committed, parts, seconds


class WorkerParts:
    """One worker's writer for one run's folder: buffers rows, writes them as parts.

    Args:
        target: The folder, run and engine the parts are written for.
        writer: This worker's part of the parts' names (``w0`` for ``worker:0``).
    """

    def __init__(self, target: PartsTarget, writer: str) -> None:
        self.target = target
        self.folder = RunFolder(target.directory, target.fmt)
        self.sink = make_sink(
            self.folder, target.fmt, target.run_id, writer=writer, holder_pid=target.holder_pid
        )
        self.sink.start()  # numbers on from parts a killed process of this worker wrote
        # Rows a killed process of this worker wrote before the engine heard of them: a
        # resent episode among them is answered from its part, never played again.
        self.earlier = {} if self.sink.parts_written == 0 else self._earlier_keys(writer)
        # Rows wait as dicts (``pending``) until ``CONVERT_ROWS`` of them, or a part, are
        # there, then go to Arrow together (``buffer``): one row alone costs about 20 times
        # its share of a batch of 100 (Arrow builds the nested schema's builders per call),
        # and a part's worth at once would hold the worker's loop for a second.
        self.pending: list[dict[str, Any]] = []
        self.buffer: list[pa.Table] = []
        self.buffered = 0  # rows in ``buffer`` and ``pending`` together
        self.owners: list[tuple[ChunkCommits, int]] = []
        self.lock = asyncio.Lock()
        self.timer: asyncio.Task[None] | None = None
        self.writes: set[asyncio.Task[None]] = set()
        self.rows_written = 0
        self.seconds_writing = 0.0

    def _earlier_keys(self, writer: str) -> dict[tuple[str, int], Path]:
        keys: dict[tuple[str, int], Path] = {}
        for part in self.folder.writer_parts(self.target.run_id, writer):
            for _, row in self.folder.rows(["task_id", "sample_index"], parts=[part]):
                keys[(row["task_id"], row["sample_index"])] = part
        return keys

    def written_before(self, key: tuple[str, int]) -> tuple[dict[str, Any], str] | None:
        """The row of ``key`` and its part, if a killed process of this worker wrote it."""
        part = self.earlier.get(key)
        if part is None:
            return None
        for _, row in self.folder.rows(parts=[part], task_id=key[0]):
            if row["sample_index"] == key[1]:
                return row, str(part)
        return None

    def add(self, owner: ChunkCommits, indices: list[int], rows: list[dict[str, Any]]) -> None:
        """Buffer the rows of ``owner``'s episodes ``indices``; a part is written when due."""
        if not rows or owner.error is not None:  # a failed call's rows are the engine's now
            return
        self.pending += rows
        self.buffered += len(rows)
        self.owners += [(owner, index) for index in indices]
        owner.waiting += len(rows)
        if len(self.pending) >= CONVERT_ROWS:
            self._convert()
        if self.buffered >= self.target.rows_per_part:
            self._spawn(self._write_due())
        elif self.timer is None:
            self.timer = asyncio.ensure_future(self._write_after(self.target.flush_interval_s))

    def _convert(self) -> None:
        """Move the pending rows into the Arrow buffer, in one conversion. A row the schema
        does not take ends its own call, as a failed write does; the others' rows stay."""
        if not self.pending:
            return
        try:
            batch = pa.RecordBatch.from_struct_array(pa.array(self.pending, type=_ROW_TYPE))
        except Exception as exc:
            waiting = self.owners[len(self.owners) - len(self.pending) :]
            pairs = zip(waiting, self.pending, strict=True)
            refused = [pair for pair, row in pairs if _refused(row)]
            self._fail(refused or waiting, exc)  # drops their rows, pending ones included
            self._convert()
            return
        self.buffer.append(pa.Table.from_batches([batch]))
        self.pending = []

    def _fail(self, owners: list[tuple[ChunkCommits, int]], exc: BaseException) -> None:
        """End the calls of ``owners``: their rows leave the buffer, ``error`` says why."""
        for owner in {id(owner): owner for owner, _ in owners}.values():
            owner.error = exc
            self.abandon(owner)
            owner.changed.set()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self.writes.add(task)
        task.add_done_callback(self.writes.discard)

    async def flush(self) -> int:
        """Write every buffered row now; returns the rows this writer has written so far."""
        async with self.lock:
            while self.buffered:
                await self._write(min(self.buffered, self.target.rows_per_part))
        return self.rows_written

    def abandon(self, owner: ChunkCommits) -> None:
        """Drop ``owner``'s buffered rows (its call ended without them: the engine sends
        those episodes again or ends them itself, so they must never reach a part)."""
        keep = [o is not owner for o, _ in self.owners]
        if not all(keep):
            # ``owners`` lists the Arrow buffer's rows, then the pending ones.
            converted = len(keep) - len(self.pending)
            self.pending = [
                row for row, kept in zip(self.pending, keep[converted:], strict=True) if kept
            ]
            if self.buffer:
                table = pa.concat_tables(self.buffer).filter(pa.array(keep[:converted]))
                self.buffer = [table] if table.num_rows else []
            self.buffered = sum(kept for kept in keep)
            self.owners = [pair for pair, kept in zip(self.owners, keep, strict=True) if kept]
        owner.waiting = 0

    async def _write_due(self) -> None:
        async with self.lock:
            while self.buffered >= self.target.rows_per_part:
                await self._write(self.target.rows_per_part)

    async def _write_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.timer = None
        await self.flush()

    async def _write(self, n: int) -> None:
        """Write the first ``n`` buffered rows as one part (the caller holds ``lock``) and
        tell their calls; on failure, end every call that had rows in it."""
        self._convert()
        n = min(n, self.buffered)  # fewer when rows the schema refused were dropped
        if n == 0:
            return
        table = pa.concat_tables(self.buffer)
        rows, rest = table.slice(0, n), table.slice(n)
        self.buffer, self.buffered = ([rest] if rest.num_rows else []), rest.num_rows
        owners, self.owners = self.owners[:n], self.owners[n:]
        started = time.perf_counter()
        try:
            path = await asyncio.to_thread(self.sink.write, rows.combine_chunks())
        except Exception as exc:
            self._fail(owners, exc)
            return
        seconds = time.perf_counter() - started
        self.seconds_writing += seconds
        self.rows_written += n
        owners[0][0].seconds += seconds
        told: set[int] = set()
        for owner, index in owners:
            owner.waiting -= 1
            owner.committed.append(index)
            if id(owner) not in told:
                told.add(id(owner))
                owner.parts.append(str(path))
                owner.changed.set()


def _refused(row: dict[str, Any]) -> bool:
    """The part schema does not take ``row`` (a bug upstream: rows come from ``to_row``)."""
    try:
        pa.array([row], type=_ROW_TYPE)
    except Exception:
        return True
    return False


@dataclass
class Finished:
    """Episodes of a chunk that finished together: ``indices`` into the chunk, and their
    ``rows`` (``WorkerRunner.play``)."""

    indices: list[int] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
