"""What one ``collect`` runs: its tasks read and checked once, the rejects, the limit, resume.

``RolloutEngine.collect`` and ``rayrollout collect`` both go through here, so a Python caller
gets what the command line gets: every row of a tasks file (or a list of rows) checked
before anything starts, errors naming the file, line and field, ``skip_invalid`` writing
the bad rows to the output folder's rejects file, ``limit`` and ``resume``.

A collection is planned in two steps around the engine's start:

1. ``plan_collect`` reads the rows once, before Ray or the engine starts: a file with bad
   rows runs nothing and costs no cluster start-up.
2. ``CollectPlan.open_output`` runs once the engine holds the output folder's lock (no
   earlier writer can still be adding parts): it refuses another run's parts unless
   ``resume`` or ``output.overwrite`` (which deletes them; ``refuse_old_parts``, checked
   once before the policy deploys too), writes the rejects and reads which
   ``(task_id, sample_index)`` pairs are already written (``resume``).

Task ids are unique within a source (``tasks.UniqueTaskIds``): a repeat is a row error.

A tasks file or a list is read whole into ``Task`` objects before the run, so that the file
is read once (it was read twice before: once to check, once to submit). Measured for 20,000
rows of weather tasks (a one-message prompt and a verifier field each, a 2.5 MB file):
32 MB of Python objects held in the driver (about 1.6 KB a task, tracemalloc), 0.5 s to read
and check them. A million such rows would hold about 1.6 GB: stream a file that large
instead (``collect(read_tasks(path))``). An iterator (a generator of rows or tasks, as a
training loop or ``benchmarks/memory.py`` feeds) is never held whole: its rows are checked as
they are submitted, and a bad one ends the run there unless ``skip_invalid``.

Example:
    >>> plan = plan_collect("tasks.jsonl", config)  # doctest: +SKIP
    >>> engine.start(); plan.open_output(engine.config)  # doctest: +SKIP
    >>> plan.episodes, len(plan.rejects)  # doctest: +SKIP
    (240, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rayrollout.data.config import ConfigError, RunConfig
from rayrollout.data.run_folder import REJECTS_FILE, RunFolder
from rayrollout.data.schema import Task
from rayrollout.data.tasks import InvalidTaskError, UniqueTaskIds, parse_task_row, read_tasks
from rayrollout.engine.episode import EpisodeSpec
from rayrollout.environment.registry import (
    UnknownEnvironmentError,
    available_environments,
    load_environment,
)
from rayrollout.errors import InputError

__all__ = [
    "MAX_ERRORS_SHOWN",
    "CollectPlan",
    "InvalidTasksError",
    "OutputNotEmptyError",
    "TaskSource",
    "expand",
    "plan_collect",
    "refuse_old_parts",
]

MAX_ERRORS_SHOWN = 50
TaskSource = str | Path | Iterable[Task | dict[str, Any]]
"""A tasks file (JSONL or Parquet), or task rows (``Task`` objects or row dicts)."""
Reject = tuple[InvalidTaskError, str | None]
"""A row left out by ``skip_invalid``: why, and its raw text (None for an in-memory row)."""


class OutputNotEmptyError(InputError, FileExistsError):
    """A new run met an earlier run's parts in its output folder (without resume/overwrite)."""


def refuse_old_parts(folder: RunFolder, config: RunConfig, run_id: str | None) -> list[Path]:
    """The parts of runs other than ``run_id`` in ``folder`` that ``config`` may write over.

    A new run that met them and would append a second copy of every sample is refused
    unless ``resume`` (write only what is missing) or ``output.overwrite`` (delete them
    first); returns them (for ``overwrite`` to delete), empty under ``resume``.

    Raises:
        OutputNotEmptyError: parts of another run, and neither ``resume`` nor ``overwrite``.
    """
    old = folder.parts_of_other_runs(run_id)
    if not old or config.resume:
        return []
    if not config.output.overwrite:
        runs = sorted({RunFolder.run_of(part) for part in old})
        raise OutputNotEmptyError(
            f"output folder {folder.path} already holds {len(old)} part(s) of an earlier run "
            f"({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}); nothing was run. Pass "
            "--resume to finish that run (only missing (task_id, sample_index) pairs are "
            "written), --overwrite to delete its parts first, or another --out "
            "(resume=True or output.overwrite=True in Python)"
        )
    return old


class InvalidTasksError(InputError, ValueError):
    """Rows that cannot run, found before anything ran; the message lists them (up to 50)."""

    def __init__(self, source: str, errors: list[InvalidTaskError]) -> None:
        self.source, self.errors = source, errors
        shown = "\n".join(f"  {exc}" for exc in errors[:MAX_ERRORS_SHOWN])
        more = len(errors) - MAX_ERRORS_SHOWN
        super().__init__(
            f"{len(errors)} invalid row(s) in {source}; nothing was run. Fix them, or pass "
            f"--skip-invalid (skip_invalid=True in Python) to run the valid rows and write "
            f"the rest to {REJECTS_FILE} in the output folder:\n{shown}"
            + (f"\n  ... and {more} more" if more > 0 else "")
        )


@dataclass
class CollectPlan:
    """The tasks one collection runs, what it left out, and what is already written.

    Attributes:
        source: Where the tasks came from (a file's path, or ``<rows>``).
        tasks: The valid tasks, in order: a list when read whole (a file, a list of rows),
            an iterator when streamed (checked as they are submitted).
        num_repeats: Samples per task.
        rejects: Rows ``skip_invalid`` left out (a streamed source adds to it as it goes).
        written: ``(task_id, sample_index)`` pairs already in the output folder (``resume``);
            filled by ``open_output``.
    """

    source: str
    tasks: list[Task] | Iterator[Task]
    num_repeats: int
    rejects: list[Reject] = field(default_factory=list)
    written: set[tuple[str, int]] = field(default_factory=set)
    _folder: RunFolder | None = field(default=None, init=False, repr=False)

    @property
    def episodes(self) -> int | None:
        """Episodes the run will play (None for a streamed source: not known up front)."""
        if not isinstance(self.tasks, list):
            return None
        return sum(
            (task.task_id, sample) not in self.written
            for task in self.tasks
            for sample in range(self.num_repeats)
        )

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
        old = refuse_old_parts(self._folder, config, run_id)
        if config.output.overwrite:
            self._folder.remove(old, rejects=first)
        for exc, raw in self.rejects:
            self._folder.add_reject(exc.to_record(raw))
        if config.resume:
            self.written = self._folder.written_keys()

    def reject(self, exc: InvalidTaskError, raw: str | None) -> None:
        """Leave one row out (``skip_invalid``); once the output is open it is written at once."""
        self.rejects.append((exc, raw))
        if self._folder is not None:
            self._folder.add_reject(exc.to_record(raw))

    def specs(self) -> Iterator[EpisodeSpec]:
        """One spec per (task, sample index) not yet written."""
        return expand(self.tasks, self.num_repeats, self.written)


def plan_collect(
    source: TaskSource | None, config: RunConfig, num_repeats: int | None = None
) -> CollectPlan:
    """Read and check a collection's tasks once, before anything starts.

    Args:
        source: A tasks file, a list of rows, or an iterator of rows (streamed, not checked
            up front); None takes the config's ``tasks`` file.
        config: ``environment`` (rows that name none), ``skip_invalid``, ``limit`` and the
            registered ``environments`` are read from it.
        num_repeats: Samples per task (default: the config's).

    Raises:
        InvalidTasksError: bad rows and not ``skip_invalid``; nothing has started.
        ConfigError: no tasks given, the tasks file does not exist, or both ``resume`` and
            ``output.overwrite``.
    """
    repeats = num_repeats or config.num_repeats
    if config.resume and config.output.overwrite:
        raise ConfigError(
            "--resume and --overwrite exclude each other: --resume finishes the run in the "
            "output folder, --overwrite deletes it; pass one"
        )
    if source is None:
        if not config.tasks:
            raise ConfigError(
                "no tasks: pass a tasks file (TASKS on the command line, or collect(tasks) in "
                "Python), or set 'tasks' in the config"
            )
        source = config.tasks
    if isinstance(source, (str, Path)):
        path = Path(source).absolute()
        if not path.exists():
            raise ConfigError(
                f"tasks file not found: {path}: pass an existing JSONL or Parquet file"
            )
        plan = CollectPlan(str(path), [], repeats)
        rows: Iterable[Task] = read_tasks(
            path,
            default_environment=config.environment,
            check_environment=environment_checker(config),
            on_invalid=plan.reject,
        )
    elif isinstance(source, Sequence):
        plan = CollectPlan("<rows>", [], repeats)
        in_memory = cast("Sequence[Task | dict[str, Any]]", source)  # mypy keeps str here
        rows = _parsed(in_memory, config.environment, plan.reject)
    else:  # an iterator: streamed; a bad row raises where it is met unless skip_invalid
        plan = CollectPlan("<rows>", iter(()), repeats)
        on_invalid = plan.reject if config.skip_invalid else None
        plan.tasks = _limited(_parsed(source, config.environment, on_invalid), config.limit)
        return plan
    plan.tasks = _read_once(rows, plan, config)
    return plan


def _read_once(rows: Iterable[Task], plan: CollectPlan, config: RunConfig) -> list[Task]:
    """The first ``limit`` valid tasks; every row checked (to the limit under ``skip_invalid``,
    which stops reading there as ``--limit`` says)."""
    tasks: list[Task] = []
    for task in rows:
        if config.limit is None or len(tasks) < config.limit:
            tasks.append(task)
        elif config.skip_invalid:
            break
    if plan.rejects and not config.skip_invalid:
        raise InvalidTasksError(plan.source, [exc for exc, _ in plan.rejects])
    return tasks


def _parsed(
    rows: Iterable[Task | dict[str, Any]],
    default_environment: str | None,
    on_invalid: Callable[[InvalidTaskError, str | None], None] | None,
) -> Iterator[Task]:
    """In-memory rows as tasks (row ``i`` is "line" ``i``, from 1). An unknown environment is
    not checked here: it fails its own episodes, so one row never stops a training loop. A
    ``task_id`` an earlier row took is refused, as in a file (``UniqueTaskIds``)."""
    unique = UniqueTaskIds()
    for line, row in enumerate(rows, start=1):
        try:
            task = (
                row
                if isinstance(row, Task)
                else parse_task_row(row, default_environment=default_environment, line=line)
            )
            unique.check(task, "<tasks>", line)
        except InvalidTaskError as exc:
            if on_invalid is None:
                raise
            on_invalid(exc, None)
            continue
        yield task


def _limited(tasks: Iterator[Task], limit: int | None) -> Iterator[Task]:
    for i, task in enumerate(tasks):
        if limit is not None and i >= limit:
            return
        yield task


def environment_checker(config: RunConfig) -> Callable[[str], bool]:
    """Whether a task's environment is known: registered, in the config, or importable."""
    names = set(available_environments()) | set(config.environments)

    def check(name: str) -> bool:
        if name in names:
            return True
        try:
            load_environment(name)
        except UnknownEnvironmentError:
            return False
        names.add(name)
        return True

    return check


def expand(
    tasks: Iterable[Task], num_repeats: int, skip: set[tuple[str, int]]
) -> Iterator[EpisodeSpec]:
    """One spec per (task, sample index), leaving out those in ``skip`` (already written)."""
    for task in tasks:
        for sample in range(num_repeats):
            if (task.task_id, sample) not in skip:
                yield EpisodeSpec(task, sample)
