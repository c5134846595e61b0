"""A collection's plan: its tasks as they stream, what it left out, what is already written.

``CollectPlan`` (from ``collect.plan_collect``) holds the checked head of the task rows, the
rest read as the engine takes them, the rows ``skip_invalid`` left out and the keys a
resumed run skips: never the task set. A bad row past the head ends the stream.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from rayrollout.api.errors import MAX_ERRORS_SHOWN, InvalidTasksError, OutputNotEmptyError
from rayrollout.api.preflight import TaskCheck
from rayrollout.data.config import RunConfig
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Task
from rayrollout.data.tasks import CheckedRow, InvalidTaskError, UniqueTaskIds
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.policy.kinds import CheckedPolicy

__all__ = [
    "MAX_ERRORS_SHOWN",
    "CollectPlan",
    "InvalidTasksError",
    "OutputNotEmptyError",
    "Reject",
    "TaskCheck",
    "WrittenKeys",
    "expand",
    "refuse_old_parts",
]

_REJECTS_KEPT = 1000  # rejects a plan keeps in memory (``rejects``); the file holds every one
Reject = tuple[InvalidTaskError, str | None]
"""A row left out by ``skip_invalid``: why, and its raw text (None for an in-memory row)."""


class WrittenKeys(Protocol):
    """What a plan skips: ``(task_id, sample_index) in written`` and ``len(written)`` (a
    set of pairs, or the folder's ``SampleKeys`` digests)."""

    def __contains__(self, key: object, /) -> bool: ...

    def __len__(self) -> int: ...


def refuse_old_parts(
    folder: RunFolder, run_id: str | None, *, resume: bool, overwrite: bool
) -> list[Path]:
    """The parts of runs other than ``run_id`` in ``folder`` that a run may write over (with
    the config's ``resume`` and ``output.overwrite``).

    A new run that met them and would append a second copy of every sample is refused
    unless ``resume`` (write only what is missing) or ``output.overwrite`` (delete them
    first); returns them (for ``overwrite`` to delete), empty under ``resume``.

    Raises:
        OutputNotEmptyError: parts of another run, and neither ``resume`` nor ``overwrite``.
    """
    old = folder.parts_of_other_runs(run_id)
    if not old or resume:
        return []
    if not overwrite:
        runs = sorted({RunFolder.run_of(part) for part in old})
        raise OutputNotEmptyError(
            f"output folder {folder.path} already holds {len(old)} part(s) of an earlier run "
            f"({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}); nothing was run. Pass "
            "--resume to finish that run (only missing (task_id, sample_index) pairs are "
            "written), --overwrite to delete its parts first, or another --out "
            "(resume=True or output.overwrite=True in Python)"
        )
    return old


class CollectPlan:
    """The tasks one collection runs, what it left out, and what is already written.

    Attributes:
        source: Where the tasks came from (a file's path, a shard set's, or ``<rows>``).
        num_repeats: Samples per task.
        head: The valid tasks among the rows read before the start (``HEAD_ROWS`` of a
            file; all of a list of rows).
        complete: The head is every task the run takes (the source ended, or ``limit``).
        rows: How many rows the source holds, once counted (None: not yet, or unknown).
        rejects: The first rows ``skip_invalid`` left out (1,000 at most; the rejects file
            holds every one), with ``rejected`` counting them all.
        written: ``(task_id, sample_index)`` pairs already in the output folder (``resume``);
            filled by ``open_output``.
        on_reject: Called with each row left out once the run streams (the command line
            prints them).
        ids: The ids the rows claimed so far, as digests (``UniqueTaskIds``).
        policy: The run's policy kind as the planning checked it (``CheckedPolicy``), handed
            to the engine that runs the plan so that nothing asks the kind again.
    """

    def __init__(
        self,
        source: str,
        num_repeats: int,
        *,
        limit: int | None = None,
        skip_invalid: bool = False,
    ) -> None:
        self.source = source
        self.num_repeats = num_repeats
        self.limit = limit
        self.skip_invalid = skip_invalid
        self.head: list[Task] = []
        self.complete = True
        self.rows: int | None = None
        self.rejects: list[Reject] = []
        self.rejected = 0
        self.written: WrittenKeys = set()
        self.on_reject: Callable[[InvalidTaskError], None] | None = None
        self.ids = UniqueTaskIds()
        self.policy: CheckedPolicy | None = None
        self._rest: Iterator[CheckedRow] = iter(())
        self._open_rest: Callable[[], Iterator[CheckedRow]] | None = None  # once Ray is up
        self._pending: list[Reject] = []  # the head's rejects, written once the folder opens
        self._folder: RunFolder | None = None
        self._hint: Callable[[], str] = str
        self._checks: TaskCheck | None = None
        self._streamed = False

    def __repr__(self) -> str:
        return (
            f"CollectPlan({self.source!r}, head={len(self.head)}, complete={self.complete}, "
            f"rejected={self.rejected})"
        )

    @property
    def empty(self) -> bool:
        """The source held no row at all (not even an invalid one): there is nothing to run,
        so nothing is started and no output folder is made."""
        return self.complete and not self.head and not self.rejected

    @property
    def episodes(self) -> int | None:
        """Episodes the run will play: exact when the head is every task, else an estimate
        from the row count (rows not yet rejected, to ``limit``, less what is written),
        None while it is not known."""
        if self.complete:
            return sum(
                (task.task_id, sample) not in self.written
                for task in self.head
                for sample in range(self.num_repeats)
            )
        if self.rows is None:
            return None
        rows = self.rows - self.rejected
        if self.limit is not None:
            rows = min(rows, self.limit)
        return max(0, rows * self.num_repeats - len(self.written))

    @property
    def tasks(self) -> Iterator[Task]:
        """The valid tasks in order: the head, then the rest as they are read (once only).

        Raises:
            InvalidTasksError: a bad row past the head, without ``skip_invalid`` (``stopped``).
            UnknownAgentError: a row past the head names an agent that does not exist.
            EnvironmentCheckError: a row past the head names what its environment cannot
                play (``TaskCheck``).
        """
        if self._streamed:
            raise RuntimeError("a plan's tasks stream once; plan the collection again")
        self._streamed = True
        return self._stream()

    def _stream(self) -> Iterator[Task]:
        if self._open_rest is not None:  # a shard set's reader starts as the head plays
            self._rest = self._open_rest()
        try:
            yield from self.head
            taken = len(self.head)
            while self.limit is None or taken < self.limit:  # never a row past the limit
                item = next(self._rest, None)
                if item is None:
                    break
                source, line, task, raw = item
                if isinstance(task, InvalidTaskError):
                    if not self.skip_invalid:
                        raise InvalidTasksError(self.source, [task], self._hint(), stopped=True)
                    self.reject(task, raw)
                    continue
                if self._checks is not None:
                    self._checks(task, f"{source} line {line}")
                taken += 1
                yield task
        finally:  # at the end, the limit, an error or a stopped run: the file is closed, a
            # shard set's reader actor killed
            close = getattr(self._rest, "close", None)
            if close is not None:
                close()

    def open_output(self, config: RunConfig, run_id: str | None = None, first: bool = True) -> None:
        """Check the folder, write the rejects and read what is written; call with the
        output folder's lock held (after ``RolloutEngine.start``), so no earlier writer is
        still adding parts.

        Args:
            config: ``output.dir``, ``resume`` and ``output.overwrite`` are read from it.
            run_id: The engine's run: its own parts are never "an earlier run's" (a second
                ``collect`` on one engine, ``generate(write=True)`` before it).
            first: This engine's first collection: ``overwrite`` deletes the rejects too.

        Raises:
            OutputNotEmptyError: the folder holds another run's parts (``refuse_old_parts``).
        """
        self._folder = RunFolder(config.output.dir)
        old = refuse_old_parts(
            self._folder, run_id, resume=config.resume, overwrite=config.output.overwrite
        )
        if config.output.overwrite:
            self._folder.remove(old, rejects=first)
        for exc, raw in self._pending:
            self._folder.add_reject(exc.to_record(raw))
        self._pending = []
        if config.resume:
            self.written = self._folder.written_digests()

    def reject(self, exc: InvalidTaskError, raw: str | None) -> None:
        """Leave one row out (``skip_invalid``); once the output is open it is written at once."""
        self.rejected += 1
        if len(self.rejects) < _REJECTS_KEPT:
            self.rejects.append((exc, raw))
        if self._folder is None:
            self._pending.append((exc, raw))
            return
        self._folder.add_reject(exc.to_record(raw))
        if self.on_reject is not None:
            self.on_reject(exc)

    def specs(self) -> Iterator[EpisodeSpec]:
        """One spec per (task, sample index) not yet written, read as they are taken."""
        return expand(self.tasks, self.num_repeats, self.written)


def expand(
    tasks: Iterable[Task], num_repeats: int, skip: Container[tuple[str, int]]
) -> Iterator[EpisodeSpec]:
    """One spec per (task, sample index), leaving out those in ``skip`` (already written)."""
    for task in tasks:
        for sample in range(num_repeats):
            if (task.task_id, sample) not in skip:
                yield EpisodeSpec(task, sample)
