"""The Ray Data source of a shard set's rows: tables of ``(source, line, raw)`` per shard.

Ray Data lists, opens and schedules the shards; this class reads one at a time,
``BLOCK_ROWS`` rows to a table, so a read task streams its shard. Apart from
``task_shards`` because it imports Ray Data, which only the reading actor should pay for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from ray.data.datasource import FileBasedDatasource

from rayrollout.data.task_shard_head import shard_lines
from rayrollout.data.task_shards import BLOCK_ROWS

__all__ = ["TaskShardSource"]

_SCHEMA = pa.schema([("source", pa.string()), ("line", pa.int64()), ("raw", pa.large_binary())])


class TaskShardSource(FileBasedDatasource):
    """A shard set's rows, named by their shard's path under ``root`` and their line.

    Args:
        paths: The shards' paths, in the order their rows should come.
        root: The folder the names are relative to.
    """

    def __init__(self, paths: list[str], root: str) -> None:
        super().__init__(paths)
        self._root = root

    def _open_input_source(self, filesystem: Any, path: str, **open_args: Any) -> Any:
        """A Parquet shard opened for random access (its footer is read first); a JSONL
        shard as Ray Data opens files, a sequential stream (the base class's way)."""
        if path.endswith(".parquet"):
            return filesystem.open_input_file(path)
        return super()._open_input_source(filesystem, path, **open_args)

    def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
        name = Path(os.path.relpath(path, self._root)).as_posix()
        lines: list[int] = []
        raws: list[bytes] = []
        for line, raw in shard_lines(f, path.endswith(".parquet")):
            lines.append(line)
            raws.append(raw)
            if len(lines) >= BLOCK_ROWS:
                yield _block(name, lines, raws)
                lines, raws = [], []
        if lines:
            yield _block(name, lines, raws)


def _block(name: str, lines: list[int], raws: list[bytes]) -> pa.Table:
    names = pa.array([name] * len(lines), pa.string())
    columns = [names, pa.array(lines, pa.int64()), pa.array(raws, pa.large_binary())]
    return pa.Table.from_arrays(columns, schema=_SCHEMA)
