"""The engine actor's streaming interface: episodes in, their rows back one batch of finished
episodes at a time, as JSON lines, for the HTTP service (``rayrollout.api.service``).

``generate`` answers when a whole round is done (GRPO groups); a service streaming
trajectories to a trainer needs each row as it finishes. ``stream`` queues its episodes
through the same queue, feeder and workers as ``collect`` and ``generate``, registered in the
actor's ``waiters`` as ``generate``'s are, and yields the rows of each batch a worker hands
back (rows finishing within 5 ms travel as one item: each item of a Ray streaming
generator costs the engine a put, and the engine's loop is the run's one shared process).
Rows are encoded once, here, with orjson (``Trajectory.to_row``'s schema as Arrow
reads it back): the service only frames them, and the bytes cross the Ray call whole (cheaper
to pickle than nested dicts, see ``chunks``).

A mixin of ``EngineActor``, like ``training``: Ray exposes inherited methods as remote ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from rayrollout.data.task_digests import NextSamples
from rayrollout.engine.episode import EpisodeSpec

__all__ = ["RowSink", "StreamedRow", "StreamingAPI"]

_GATHER_S = 0.005  # rows finishing this close together go as one item of the stream
StreamedRow = tuple[str, int, bytes]
"""One finished episode: its task id, sample index and row as JSON (no newline)."""


class RowSink:
    """Rows of one ``stream`` call, collected as their batches come back (``_deliver`` calls
    ``add``); the call takes them in the batches they came in."""

    def __init__(self, specs: list[EpisodeSpec], write: bool) -> None:
        self.specs = specs  # keeps the specs alive, so their ids stay unique while waited on
        self.write = write  # read by the engine's _deliver: also send the rows to the writer
        self.rows: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.closed = False  # the caller went away: later rows are dropped (written if asked)

    def add(self, row: dict[str, Any]) -> None:
        if not self.closed:
            self.rows.append(row)
            self.arrived.set()

    async def take(self, gather_s: float) -> list[dict[str, Any]]:
        """Every row that arrived since the last take, waiting for at least one, then
        ``gather_s`` more for the rows of other workers' batches finishing with it."""
        while not self.rows:
            self.arrived.clear()
            await self.arrived.wait()
        if gather_s:
            await asyncio.sleep(gather_s)
        rows, self.rows = self.rows, []
        return rows


class StreamingAPI:
    """What the HTTP service calls on the engine actor: ``stream`` and ``reserve_samples``."""

    # Supplied by the engine actor (``actor.EngineActor``) and ``training.TrainingLoopAPI``.
    waiters: dict[int, Any]
    submit: Callable[[list[EpisodeSpec]], Awaitable[None]]
    _samples_on_disk: Callable[[], Awaitable[NextSamples]]  # digests, read as a dict

    async def stream(
        self, specs: list[EpisodeSpec], write: bool = False
    ) -> AsyncIterator[list[StreamedRow]]:
        """Run ``specs`` through the queue; yield their rows as batches of them finish.

        Each item is a list of ``(task_id, sample_index, row JSON)``; every spec is answered
        exactly once (a failed episode by an error row). ``write`` also sends the rows to the
        output folder. Called as a Ray streaming generator: ``async for ref in
        engine.stream.remote(specs)``; the queue's backpressure applies while submitting.
        """
        sink = RowSink(specs, write)
        for spec in specs:
            self.waiters[id(spec)] = sink
        try:
            await self.submit(specs)
            remaining = len(specs)
            while remaining:
                rows = await sink.take(_GATHER_S if remaining > 1 else 0.0)
                remaining -= len(rows)
                yield [
                    (row["task_id"], row["sample_index"], orjson.dumps(row, default=str))
                    for row in rows
                ]
        finally:
            sink.closed = True  # a caller that went away: the episodes run out, unread

    async def reserve_samples(self, counts: dict[str, int]) -> dict[str, int]:
        """The first free sample index of each task id, claiming ``counts[task_id]`` indices
        from there, so rows the service writes keep ``(task_id, sample_index)`` unique on
        disk across batches (as ``generate(write=True)`` does)."""
        taken = await self._samples_on_disk()
        first: dict[str, int] = {}
        for task_id, count in counts.items():
            first[task_id] = taken.get(task_id, 0)
            taken[task_id] = first[task_id] + count
        return first
