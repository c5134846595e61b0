"""A worker's one session with its engine: episodes come in by ``take``, reports go out on
one stream, at most one report per ``report_interval_s``.

Each Ray message costs the engine actor about as much CPU as a whole episode's bookkeeping,
so what a worker tells the engine is coalesced across every episode it holds: which
finished (with their sums per environment, ``Tally``), which its parts now hold, and the
rows a caller waits on. The worker also observes its episodes' histograms. Episodes are
named by the engine's sequence numbers, so a resent episode is the same one.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

from rayrollout.engine.chunks import WorkerReport
from rayrollout.engine.episode_spec import EpisodeSpec, failed_trajectory
from rayrollout.engine.metrics import EpisodeHistograms
from rayrollout.engine.tally import Tally
from rayrollout.engine.worker_parts import ChunkCommits, WorkerParts

__all__ = ["REPORT_INTERVAL_S", "WorkerSession"]

REPORT_INTERVAL_S = 0.05
"""The least time between two reports of one worker: at most 20 messages a second whatever
the episode rate, and no wait at all for a worker that reported less recently."""


class WorkerSession:
    """The episodes a worker plays for one engine, and what it has yet to report.

    Args:
        play: Plays one episode and returns its row (``WorkerRunner.run_admitted``).
        parts: This worker's parts in the engine's folder; None when its rows go back
            (a worker on another node than the folder).
        interval_s: The least time between two reports.
        histograms: Where this worker observes its episodes (None: nowhere).
    """

    def __init__(
        self,
        play: Callable[[EpisodeSpec], Awaitable[dict[str, Any]]],
        parts: WorkerParts | None,
        interval_s: float = REPORT_INTERVAL_S,
        histograms: EpisodeHistograms | None = None,
    ) -> None:
        self.play = play
        self.parts = parts
        self.interval_s = interval_s
        self.histograms = histograms
        self.changed = asyncio.Event()  # something to report: an episode ended, a part renamed
        self.commits = ChunkCommits(changed=self.changed)  # the open session's rows in ``parts``
        self.running: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.finished: list[int] = []
        self.tally = Tally()  # of the finished episodes the engine has not counted
        self.counted: set[int] = set()  # taken, though the engine counted them already
        self.to_write: list[tuple[int, dict[str, Any]]] = []  # finished, for ``parts``
        self.back: list[tuple[int, dict[str, Any]]] = []  # finished, rows for the engine
        self.answered: list[tuple[int, str]] = []  # (seq, part) a killed process wrote
        self.last_report = 0.0
        self.closed = False

    def take(
        self, episodes: list[tuple[int, EpisodeSpec, bool]], counted: Collection[int] = ()
    ) -> None:
        """Start ``(seq, spec, write)`` episodes; ``write``: this worker writes the row. An
        episode a killed process of this worker already wrote is answered from its part.
        ``counted``: those whose figures the engine has already (they finished on a
        session that ended before their rows reached a part); they stay out of the tally."""
        self.counted.update(counted)
        for seq, spec, write in episodes:
            write = write and self.parts is not None
            if seq in self.running:
                continue  # sent again on the open session: it is already playing
            if write and self.parts is not None and self.parts.earlier:
                found = self.parts.written_before(spec.key)
                if found is not None:
                    row, part = found
                    self.finished.append(seq)
                    if seq in self.counted:
                        self.counted.discard(seq)
                    else:  # its histograms went out from the process that played it
                        self.tally.add(row)
                    self.answered.append((seq, part))
                    self.changed.set()
                    continue
            task = asyncio.ensure_future(self.play(spec))
            self.running[seq] = task
            task.add_done_callback(functools.partial(self._ended, seq, spec, write))

    def _ended(
        self, seq: int, spec: EpisodeSpec, write: bool, task: asyncio.Future[dict[str, Any]]
    ) -> None:
        if self.running.pop(seq, None) is None or task.cancelled():
            return
        error = task.exception()
        if error is None:
            row = task.result()
        else:  # the episode frame records failures itself; this is a bug, kept as the row
            reason = f"worker failed: {type(error).__name__}: {error}"
            row = failed_trajectory(spec, "", reason).to_row()
        self._finished(seq, row, write)

    def _finished(self, seq: int, row: dict[str, Any], write: bool) -> None:
        self.finished.append(seq)
        if seq in self.counted:
            self.counted.discard(seq)
        else:
            self.tally.add(row)
            if self.histograms is not None:
                self.histograms.observe(row)
        (self.to_write if write else self.back).append((seq, row))
        self.changed.set()

    async def reports(self) -> AsyncIterator[WorkerReport]:
        """What happened since the last report, as it happens, at most one report per
        ``interval_s``; raises when a part of the session's rows could not be written."""
        while not self.closed:
            await self.changed.wait()
            if self.closed:
                return
            wait = self.last_report + self.interval_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            report = self._report()
            if report is not None:
                self.last_report = time.monotonic()
                yield report

    def _report(self) -> WorkerReport | None:
        self.changed.clear()
        if self.to_write and self.parts is not None:
            seqs, rows = zip(*self.to_write, strict=True)
            self.parts.add(self.commits, list(seqs), list(rows))
        self.to_write = []
        committed, parts, seconds = self.commits.take()
        if self.commits.error is not None:
            raise self.commits.error
        for seq, part in self.answered:
            committed.append(seq)
            parts += [part] if part not in parts else []
        if not (self.finished or committed):
            return None
        report = WorkerReport.build(self.finished, self.tally, self.back, committed, parts, seconds)
        self.finished, self.tally, self.back, self.answered = [], Tally(), [], []
        return report

    def close(self) -> None:
        """Stop every episode of the session; rows not in a part yet never reach one (the
        engine sends those episodes again, or ends them itself)."""
        self.closed = True
        self.changed.set()
        for task in list(self.running.values()):
            task.cancel()
        self.running.clear()
        if self.parts is not None:
            self.parts.abandon(self.commits)
