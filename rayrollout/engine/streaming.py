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

After an engine died under the service's batches, the new engine takes two calls from the
service before their samples run again: ``claim_samples`` (the sample indices those batches
hold are not handed to a new batch) and ``restore_rows`` (their rows the dead engine had not
yet written to a part, from the service's journal, are written now).

A mixin of ``EngineActor``, like ``training``: Ray exposes inherited methods as remote ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import orjson

from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Trajectory
from rayrollout.data.task_digests import NextSamples
from rayrollout.engine.episode_spec import EpisodeSpec

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
        self.error: BaseException | None = None  # queueing the specs failed
        self.submitting: asyncio.Task[None] | None = None

    def add(self, row: dict[str, Any]) -> None:
        if not self.closed:
            self.rows.append(row)
            self.arrived.set()

    def queued(self, submitting: asyncio.Task[None]) -> None:
        """The specs' submit ended: a failure ends the call (rows taken so far stand)."""
        if not submitting.cancelled() and submitting.exception() is not None:
            self.error = submitting.exception()
            self.arrived.set()

    async def take(self, gather_s: float) -> list[dict[str, Any]]:
        """Every row that arrived since the last take, waiting for at least one, then
        ``gather_s`` more for the rows of other workers' batches finishing with it.

        Raises:
            BaseException: what failed the specs' submit, once no row is left to take.
        """
        while not self.rows:
            if self.error is not None:
                raise self.error
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
    submit: Callable[[list[EpisodeSpec]], Coroutine[Any, Any, None]]
    _samples_on_disk: Callable[[], Awaitable[NextSamples]]  # digests, read as a dict
    folder: RunFolder
    _write: Callable[..., Awaitable[None]]  # rows to the writer; drain=True: to a part now

    async def stream(
        self, specs: list[EpisodeSpec], write: bool = False
    ) -> AsyncIterator[list[StreamedRow]]:
        """Run ``specs`` through the queue; yield their rows as batches of them finish.

        Each item is a list of ``(task_id, sample_index, row JSON)``; every spec is answered
        exactly once (a failed episode by an error row). ``write`` also sends the rows to the
        output folder. Called as a Ray streaming generator: ``async for ref in
        engine.stream.remote(specs)``. The specs enter the queue (with its backpressure)
        while the first rows are already yielded: a call of a thousand specs does not hold
        its first rows until its last spec is queued.
        """
        sink = RowSink(specs, write)
        for spec in specs:
            self.waiters[id(spec)] = sink
        # Held by the sink, which the waiters hold while any spec is unanswered: a caller
        # going away leaves the task running, never collected half-way.
        sink.submitting = asyncio.create_task(self.submit(specs))
        sink.submitting.add_done_callback(sink.queued)
        try:
            remaining = len(specs)
            while remaining:
                rows = await sink.take(_GATHER_S if remaining > 1 else 0.0)
                remaining -= len(rows)
                yield [
                    (row["task_id"], row["sample_index"], orjson.dumps(row, default=str))
                    for row in rows
                ]
        finally:
            # A caller that went away: the episodes (all of them queued) run out, unread.
            sink.closed = True

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

    async def claim_samples(self, ends: dict[str, int]) -> None:
        """Sample indices below ``ends[task_id]`` are taken (batches of a dead engine that
        the service will finish): ``reserve_samples`` hands out none of them."""
        taken = await self._samples_on_disk()
        for task_id, end in ends.items():
            taken.raise_to(task_id, end)

    async def restore_rows(self, rows: list[bytes]) -> int:
        """Write the rows (``Trajectory.to_row`` as JSON) whose ``(task_id, sample_index)``
        the output folder lacks, in a part now; returns how many were written."""
        written = await asyncio.to_thread(self.folder.written_digests)
        missing = []
        for raw in rows:
            row = orjson.loads(raw)
            if (row["task_id"], row["sample_index"]) not in written:
                missing.append(Trajectory.from_row(row).to_row())
        if missing:
            await self._write(missing, drain=True)
        return len(missing)
