"""The actor that iterates a shard set's dataset and hands its rows to the driver in chunks.

An actor, not the driver, because every object-store page a process reads stays in its
resident set: the driver takes small chunks (``task_shards.CHUNK_BYTES``) and its memory
stays that of one file. Ray Data is imported in the actor only.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray

from rayrollout.data.task_shards import BLOCK_BYTES, BLOCK_ROWS, READ_AHEAD, READ_TASKS

__all__ = ["ShardReader"]


@ray.remote(num_cpus=0)
class ShardReader:
    """Iterates a shard set's dataset and hands its rows out in chunks (``take``).

    Args:
        paths: The shards, in the order their rows should come (Ray Data keeps it:
            ``preserve_order``, so ``--limit`` takes the same rows every run).
        root: The folder the rows' shard names are relative to.
        skip_lines: Lines of the first shard already read by the driver (its head).
    """

    def __init__(self, paths: list[str], root: str, skip_lines: int) -> None:
        import ray.data

        from rayrollout.data.task_shard_source import TaskShardSource

        source = TaskShardSource(paths, root=root)
        dataset = ray.data.read_datasource(source, num_cpus=0.25, concurrency=READ_TASKS)
        context = dataset.context
        context.execution_options.preserve_order = True
        # Small blocks, few of them ahead: the read stays a few MB ahead of the engine
        # instead of filling the object store with shards a --limit never reaches, and the
        # first rows come after a few thousand are read, not after a whole shard.
        context.target_max_block_size = BLOCK_BYTES
        limits = context.execution_options.resource_limits
        context.execution_options.resource_limits = limits.copy(object_store_memory=READ_AHEAD)
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        self._batches = iter(
            dataset.iter_batches(batch_format="pyarrow", batch_size=BLOCK_ROWS, prefetch_batches=1)
        )
        self._first = Path(os.path.relpath(paths[0], root)).as_posix()
        self._skip = skip_lines
        self._rows: list[tuple[str, int, bytes]] = []
        self._at = 0

    @ray.method(enable_task_events=False)
    def take(self, most_bytes: int) -> list[tuple[str, int, bytes]]:
        """The next rows, ``(shard, line, raw)``, up to ``most_bytes`` of raw text (one row at
        least); empty at the end of the set.

        Without task events: the driver calls this once per chunk, thousands of times a
        run, and for each call Ray keeps some KB of events in the caller (for its state
        API), megabytes of the driver's memory over a run; these calls tell nobody anything."""
        chunk: list[tuple[str, int, bytes]] = []
        size = 0
        while size < most_bytes:
            if self._at == len(self._rows) and not self._next_batch():
                break
            row = self._rows[self._at]
            self._at += 1
            if row[1] <= self._skip and row[0] == self._first:
                continue
            if chunk and size + len(row[2]) > most_bytes:
                self._at -= 1  # the next call's first row
                break
            chunk.append(row)
            size += len(row[2])
        return chunk

    def _next_batch(self) -> bool:
        batch = next(self._batches, None)
        if batch is None:
            return False
        columns = [batch.column(name).to_pylist() for name in ("source", "line", "raw")]
        self._rows = list(zip(*columns, strict=True))
        self._at = 0
        return True
