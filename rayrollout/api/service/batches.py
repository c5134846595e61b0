"""A submitted batch on the service: its samples to send, its finished rows by cursor, what
the client acknowledged; and the registry of batches by id.

Each finished row gets the next cursor of its batch (0, 1, 2, ...) and is kept, framed as a
stream line, until the client acknowledges a cursor past it; a stream read from cursor ``k``
sends rows ``k, k+1, ...`` as they come, so a client that reconnects from the cursor after its
last row loses and repeats nothing. An acknowledgement reaches at most the rows a stream has
handed out (``streamed``): a row nobody read is never freed. The rows kept plus the samples
running never exceed the config's ``max_buffered_rows`` for a batch: ``room`` is what the
feeder may still send. A row whose ``(task_id, sample_index)`` the batch has already seen is
dropped (the engine answers each sample once; this is the boundary's own guarantee).

Every row goes to the batch's journal (``journal``) before any stream sees it, so a batch
whose engine died keeps its rows and cursors: ``revive`` runs only the samples without a row
on a new engine, and a service started again loads the batch back from its journal
(``load``). Each revival is a new ``generation``: the failures of the dead engine's calls,
still arriving, are not the revived batch's.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from collections import deque
from typing import Any

from rayrollout.api.errors import CursorGoneError
from rayrollout.api.service.journal import BatchJournal
from rayrollout.client.models import BatchStatus, Limits, RowError
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.engine.streaming import StreamedRow

__all__ = ["Batch", "BatchRegistry", "CursorGoneError", "fingerprint"]


def fingerprint(tasks: list[dict[str, Any]], n: int, write: bool | None) -> str:
    """What a submit asked for, as a digest: a retry must match the batch it names."""
    text = json.dumps([tasks, n, write], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class Batch:
    """One batch's state; lives in the service actor's event loop (no locks needed)."""

    def __init__(
        self,
        batch_id: str,
        specs: list[EpisodeSpec],
        tasks: int,
        n: int,
        write: bool,
        digest: str,
        rejected: list[RowError],
        limits: Limits,
        journal: BatchJournal | None = None,
    ) -> None:
        self.batch_id, self.tasks, self.n, self.write = batch_id, tasks, n, write
        self.digest, self.rejected, self.limits = digest, rejected, limits
        self.specs = specs  # every sample, kept to run again what a dead engine left
        self.journal = journal
        self.generation = 0  # moves on each revival: the dead engine's calls are past ones
        self.unsent: deque[EpisodeSpec] = deque(specs)
        self.samples = len(specs)
        self.sent = 0
        self.finished = 0
        self.acknowledged = 0
        self.streamed = 0  # cursor past the last row a stream handed out (or a client named)
        self.lines: deque[bytes] = deque()  # rows from cursor ``acknowledged`` on, framed
        self.keys: set[tuple[str, int]] = set()
        self.error: str | None = None
        self.engine_gone = False
        self.deleted = False
        self.settled_at: float | None = None  # done and every row acknowledged
        self._changed = asyncio.Event()
        self.feeder: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return self.finished == self.samples

    @property
    def over(self) -> bool:
        """No more rows will come: all finished, or the batch failed."""
        return self.done or self.error is not None

    @property
    def room(self) -> int:
        """Samples the feeder may still send: kept plus running stay within the limit."""
        return self.limits.max_buffered_rows - (self.sent - self.acknowledged)

    def add(self, rows: list[StreamedRow]) -> None:
        """Finished rows from the engine, each under the next cursor, journaled first."""
        lines: list[bytes] = []
        for task_id, sample_index, row in rows:
            key = (task_id, sample_index)
            if key in self.keys:
                continue
            self.keys.add(key)
            lines.append(b'{"cursor":%d,"trajectory":%s}\n' % (self.finished + len(lines), row))
        if lines:
            if self.journal is not None:
                self.journal.append(lines)
            self.lines.extend(lines)
            self.finished += len(lines)
        self._settle()
        self._notify()

    def fail(self, error: str, engine_gone: bool = False, generation: int | None = None) -> None:
        """The batch cannot finish (its streams end saying why); a call of an earlier
        ``generation`` (a dead engine's) no longer speaks for it."""
        if generation is not None and generation != self.generation:
            return
        if self.error is None:
            self.error, self.engine_gone = error, engine_gone
            self._notify()

    def missing(self) -> deque[EpisodeSpec]:
        """The samples without a row yet, in submit order."""
        return deque(s for s in self.specs if (s.task.task_id, s.sample_index) not in self.keys)

    def revive(self) -> None:
        """After the engine died: what has no row runs again; rows and cursors stay."""
        self.generation += 1
        self.unsent = self.missing()
        self.sent = self.finished
        self.error, self.engine_gone = None, False
        self._notify()

    def load(self, lines: list[bytes], keys: list[tuple[str, int]], acked: int) -> None:
        """Rows read back from the batch's journal (a service started again): they keep
        their cursors, and only the samples without a row will run."""
        self.keys = set(keys)
        self.finished, self.acknowledged = len(lines), acked
        self.streamed = max(self.streamed, acked)
        self.lines = deque(lines[acked:])
        self.unsent = self.missing()
        self.sent = self.finished
        self._settle()

    def acknowledge(self, cursor: int) -> None:
        """The client holds every row below ``cursor``: free them, and make room."""
        if self.deleted:
            return
        cursor = min(cursor, self.finished)
        if cursor > self.acknowledged:
            while self.acknowledged < cursor:
                self.lines.popleft()
                self.acknowledged += 1
            if self.journal is not None:
                self.journal.acknowledge(self.acknowledged)
            self._notify()
        self._settle()

    def reached(self, cursor: int) -> None:
        """A stream handed out the rows below ``cursor`` (or a client said it holds them)."""
        self.streamed = max(self.streamed, min(cursor, self.finished))

    def lines_from(self, cursor: int) -> list[bytes]:
        """The framed rows from ``cursor`` on that have finished so far."""
        if cursor < self.acknowledged:
            raise CursorGoneError(
                f"cursor {cursor} of batch {self.batch_id!r} is below {self.acknowledged}, "
                "which the client already acknowledged (those rows are freed): resume from "
                f"{self.acknowledged} or later"
            )
        if cursor >= self.finished:  # none yet (islice takes no start past sys.maxsize)
            return []
        return list(itertools.islice(self.lines, cursor - self.acknowledged, None))

    async def changed(self, timeout_s: float) -> None:
        """Wait until rows arrive, rows are acknowledged or the batch fails (or the timeout)."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _settle(self) -> None:
        if self.settled_at is None and self.done and self.acknowledged == self.samples:
            self.settled_at = time.monotonic()
            self.forget_journal()

    def forget_journal(self) -> None:
        """The batch needs no journal any more (settled or deleted)."""
        if self.journal is not None:
            self.journal.remove()
            self.journal = None

    def status(self, created: bool = False) -> dict[str, Any]:
        """The batch as the wire's ``BatchStatus``."""
        status = BatchStatus(
            batch_id=self.batch_id,
            created=created,
            tasks=self.tasks,
            n=self.n,
            samples=self.samples,
            finished=self.finished,
            acknowledged=self.acknowledged,
            running=self.sent - self.finished,
            done=self.done,
            error=self.error,
            engine_gone=self.engine_gone,
            rejected=self.rejected,
            limits=self.limits,
        )
        return status.model_dump(mode="json")


class BatchRegistry:
    """Batches by id; a batch settled (or failed and deleted) ``retain_s`` ago is forgotten,
    so its id no longer dedups a submit."""

    def __init__(self, max_open: int, retain_s: float) -> None:
        self.max_open, self.retain_s = max_open, retain_s
        self.batches: dict[str, Batch] = {}

    def get(self, batch_id: str) -> Batch | None:
        self.evict()
        batch = self.batches.get(batch_id)
        return None if batch is None or batch.deleted else batch

    def known(self, batch_id: str) -> Batch | None:
        """A batch by id, deleted ones too (a retried submit must not start it again)."""
        self.evict()
        return self.batches.get(batch_id)

    def open_count(self) -> int:
        """Batches that still hold the service's memory: work left or rows unacknowledged."""
        return sum(1 for b in self.batches.values() if b.settled_at is None and not b.deleted)

    def add(self, batch: Batch) -> None:
        self.batches[batch.batch_id] = batch

    def delete(self, batch: Batch) -> None:
        """Forget a batch's rows; its id is kept ``retain_s``, so a retried submit of it
        adds nothing."""
        batch.deleted = True
        batch.lines.clear()
        batch.forget_journal()
        batch.fail("the batch was deleted")
        if batch.settled_at is None:
            batch.settled_at = time.monotonic()

    def evict(self) -> None:
        now = time.monotonic()
        for batch_id, batch in list(self.batches.items()):
            if batch.settled_at is not None and now - batch.settled_at >= self.retain_s:
                del self.batches[batch_id]
