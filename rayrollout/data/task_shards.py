"""Task sets of many files (shards), read through Ray Data's streaming reads.

``ShardSet`` names a directory or glob of Parquet or JSONL shards on a file system every
node sees; ``stream`` reads it with Ray Data through a reader actor, in shard order, each row
named by its shard and line and checked as a file's lines are, so ``--limit`` and
``--resume`` find the same rows. The first rows are read before Ray starts (``local_rows``),
so a bad first row is reported before anything starts.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rayrollout.data.errors import ShardReadError
from rayrollout.data.task_shard_head import HeadReadError, count_apart, head_apart, shard_lines
from rayrollout.data.tasks import SourceRow, row_from_line

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_ROWS",
    "CHUNK_BYTES",
    "READ_AHEAD",
    "READ_TASKS",
    "SHARD_SUFFIXES",
    "ShardReadError",
    "ShardSet",
    "is_shard_set",
]

SHARD_SUFFIXES = (".jsonl", ".json", ".parquet")
BLOCK_ROWS = 4096
"""Rows per table a read task yields, and per batch the driver takes (about 2 MB of NeMo Gym
rows)."""
BLOCK_BYTES = 4 << 20
"""Ray Data's largest block for a shard set (its default, 128 MB, would make a block of a
whole shard, read whole before its first row reaches the driver)."""
READ_AHEAD = 64 << 20
"""Object store memory the read may fill ahead of the driver (Ray Data's backpressure)."""
READ_TASKS = 4
"""Shards read at once; enough to keep ahead of the engine, few enough to leave the CPUs to
the episodes."""
CHUNK_BYTES = 64 << 10
"""Raw rows the driver takes from the reader per call: under Ray's 100 KiB limit for objects
passed inline, so rows reach the driver without the object store (see ``stream``)."""
_GLOB_CHARS = set("*?[")


def is_shard_set(path: str | Path) -> bool:
    """Whether ``path`` names a shard set (a directory, or a glob) rather than one file."""
    text = str(path)
    return Path(text).is_dir() or (not Path(text).exists() and bool(_GLOB_CHARS & set(text)))


class ShardSet:
    """The shards of a task set, in name order, each named by its path within the set.

    Args:
        spec: A directory (every ``.jsonl``/``.json``/``.parquet`` file under it) or a glob
            (``data/train-*.parquet``; quote it on the command line).

    Raises:
        FileNotFoundError: no shard matched; the message says what was looked for.
    """

    def __init__(self, spec: str | Path) -> None:
        self.spec = str(spec)
        path = Path(self.spec).absolute()
        if path.is_dir():
            found = [p for p in path.rglob("*") if p.is_file() and self._is_shard(p, path)]
            root = path
        else:
            found = [Path(p).absolute() for p in glob.glob(self.spec, recursive=True)]
            found = [p for p in found if p.is_file() and p.suffix in SHARD_SUFFIXES]
            root = Path(os.path.commonpath([p.parent for p in found])) if found else path.parent
        self.root = root
        self.files = sorted(found)
        self._taken = (0, 0)  # (shard, line) of the last row local_rows handed out
        if not self.files:
            kinds = ", ".join(SHARD_SUFFIXES)
            raise FileNotFoundError(
                f"no task shards in {self.spec}: a shard set is a directory or a glob of "
                f"{kinds} files (names starting with '.' or '_' are skipped)"
            )

    @staticmethod
    def _is_shard(path: Path, root: Path) -> bool:
        parts = path.relative_to(root).parts
        return path.suffix in SHARD_SUFFIXES and not any(p[0] in "._" for p in parts)

    def __repr__(self) -> str:
        return f"ShardSet({self.spec!r}, {len(self.files)} shards)"

    def name(self, path: str | Path) -> str:
        """A shard's path within the set: how its rows are named (``train/part-3.jsonl``)."""
        return Path(path).absolute().relative_to(self.root).as_posix()

    def count_rows(self) -> int | None:
        """Rows in the set, from the Parquet footers alone, read by a child process; None if
        a shard is JSONL (counting its lines would read every byte in the driver) or a
        footer cannot be read."""
        if any(p.suffix != ".parquet" for p in self.files):
            return None
        return count_apart(self.files)

    def local_rows(self, limit: int) -> Iterator[SourceRow]:
        """The first ``limit`` rows of the set, read without Ray, shard after shard (a JSONL
        shard's lines here, Parquet from the first Parquet shard on by a child process);
        ``stream`` goes on from the row after the last one taken.

        Raises:
            ShardReadError: a shard of the head cannot be read, named.
        """
        count = 0
        for index, path in enumerate(self.files):
            if path.suffix == ".parquet":
                yield from self._rows_apart(index, limit - count)
                return
            name = self.name(path)
            with path.open("rb") as file:
                for line, raw in shard_lines(file, parquet=False):
                    if count >= limit:
                        return
                    count += 1
                    self._taken = (index, line)
                    yield name, line, *row_from_line(name, line, raw)
            self._taken = (index + 1, 0)

    def _rows_apart(self, start: int, limit: int) -> Iterator[SourceRow]:
        """``local_rows`` from shard ``start`` on, read by a child process."""
        if limit <= 0:
            return
        try:
            rows = head_apart(self.files[start:], limit)
        except HeadReadError as exc:
            shard = "" if exc.index is None else f"{self.name(self.files[start + exc.index])}: "
            raise ShardReadError(f"cannot read the shard set {self.spec}: {shard}{exc}") from None
        for offset, line, raw in rows:
            index = start + offset
            name = self.name(self.files[index])
            self._taken = (index, line)
            yield name, line, *row_from_line(name, line, raw)
        if len(rows) < limit:  # the set ended within the head
            self._taken = (len(self.files), 0)

    def stream(self) -> Iterator[SourceRow]:
        """The rows after those ``local_rows`` handed out, through Ray Data, in shard order.

        Needs Ray up (the engine started it). The reader starts at once (its actor, Ray
        Data's first reads), so that its start-up overlaps the head's episodes; the rows
        come as the returned iterator is read, which raises ``ShardReadError`` naming the
        set if a shard cannot be read.
        """
        from rayrollout.data.task_shard_reader import ShardReader

        start, skip_lines = self._taken
        files = self.files[start:]
        if not files:
            return iter(())
        paths = [str(p) for p in files]
        reader = ShardReader.remote(paths, str(self.root), skip_lines)  # type: ignore[attr-defined]
        return self._rows_of(reader, reader.take.remote(CHUNK_BYTES))

    def _rows_of(self, reader: Any, pending: Any) -> Iterator[SourceRow]:
        """The reader's rows, a chunk at a time, the next chunk asked for while one is
        checked; the reader is killed when the rows end or are left (``close``)."""
        import ray

        try:
            while True:
                try:
                    chunk: list[tuple[str, int, bytes]] = ray.get(pending)
                except ray.exceptions.RayTaskError as exc:
                    cause = str(exc.cause if exc.cause is not None else exc).strip()
                    raise ShardReadError(
                        f"cannot read the shard set {self.spec}: {cause.splitlines()[-1]}"
                    ) from None
                if not chunk:
                    return
                pending = reader.take.remote(CHUNK_BYTES)
                for name, line, raw in chunk:
                    yield name, line, *row_from_line(name, line, raw)
        finally:
            if ray.is_initialized():  # not when the interpreter is already going down
                ray.kill(reader)
