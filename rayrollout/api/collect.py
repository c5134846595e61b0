"""What one ``collect`` runs: its tasks read and checked once, the rejects, the limit, resume.

``RolloutEngine.collect`` and ``rayrollout collect`` both go through here, so a Python caller
gets what the command line gets: every row of a tasks file (or a list of rows) checked
before anything starts, errors naming the file, line and field, ``skip_invalid`` writing
the bad rows to the output folder's rejects file, ``limit`` and ``resume``.

A collection is planned in two steps around the engine's start:

1. ``plan_collect`` reads the rows once, before Ray or the engine starts: a file with bad
   rows runs nothing and costs no cluster start-up. With ``before_start`` it also runs the
   checks of ``api.preflight`` (the output folder, an external policy's key and endpoint),
   so that every mistake found in a second is found before a start that takes minutes. A
   file without a single row plans nothing (``CollectPlan.empty``): nothing is started.
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

from rayrollout.api.preflight import (
    check_default_agent,
    check_default_environment,
    check_output_folder,
    check_policy_key,
    check_task_agents,
    check_tasks_file,
    environment_known,
    external_policy,
    probe_policy,
    unknown_environments_hint,
)
from rayrollout.data.config import ConfigError, RunConfig
from rayrollout.data.run_folder import REJECTS_FILE, RunFolder
from rayrollout.data.schema import Task
from rayrollout.data.tasks import InvalidTaskError, UniqueTaskIds, parse_task_row, read_tasks
from rayrollout.engine.episode import EpisodeSpec
from rayrollout.engine.figures import RunSnapshot
from rayrollout.engine.stats import EnvStats
from rayrollout.errors import InputError

__all__ = [
    "MAX_ERRORS_SHOWN",
    "CollectPlan",
    "InvalidTasksError",
    "OutputNotEmptyError",
    "TaskSource",
    "expand",
    "nothing_run",
    "plan_collect",
    "refuse_old_parts",
]

MAX_ERRORS_SHOWN = 50
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

    def __init__(self, source: str, errors: list[InvalidTaskError], hint: str = "") -> None:
        self.source, self.errors = source, errors
        shown = "\n".join(f"  {exc}" for exc in errors[:MAX_ERRORS_SHOWN])
        more = len(errors) - MAX_ERRORS_SHOWN
        super().__init__(
            f"{len(errors)} invalid row(s) in {source}; nothing was run. Fix them, or pass "
            f"--skip-invalid (skip_invalid=True in Python) to run the valid rows and write "
            f"the rest to {REJECTS_FILE} in the output folder:\n{shown}"
            + (f"\n  ... and {more} more" if more > 0 else "")
            + (f"\n  {hint}" if hint else "")
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
    def empty(self) -> bool:
        """The source held no row at all (not even an invalid one): there is nothing to run,
        so nothing is started and no output folder is made."""
        return isinstance(self.tasks, list) and not self.tasks and not self.rejects

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


TaskSource = str | Path | Iterable[Task | dict[str, Any]] | CollectPlan
"""A tasks file (JSONL or Parquet), task rows (``Task`` objects or row dicts), or a plan
``plan_collect`` already made (the command line plans, and checks, before it builds the
engine; the engine's ``collect`` then runs that plan instead of reading the file again)."""


def plan_collect(
    source: TaskSource | None,
    config: RunConfig,
    num_repeats: int | None = None,
    *,
    before_start: bool = False,
    require_key: bool = False,
) -> CollectPlan:
    """Read and check a collection's tasks once, before anything starts.

    The checks run cheap and local first, the network last (``api.preflight``): the tasks
    path, ``--env``, ``--agent``, the output folder and the policy's key, then the rows (and
    the agents a file's rows name), then one probe of an external policy's endpoint, which
    an empty file never waits for.

    Args:
        source: A tasks file, a list of rows, or an iterator of rows (streamed, not checked
            up front); None takes the config's ``tasks`` file. A ``CollectPlan`` is returned
            as it is (checked when it was made).
        config: ``environment`` and ``agent`` (rows that name none), ``skip_invalid``,
            ``limit``, the registered ``environments`` and ``agent_settings`` are read from it.
        num_repeats: Samples per task (default: the config's).
        before_start: Nothing is started yet: also check the output folder and an external
            policy (``RolloutEngine.collect`` on an engine not yet started, the command line).
        require_key: An external policy without its key's variable set is an error (the
            command line); else a server that refuses to answer without one is.

    Raises:
        InvalidTasksError: bad rows and not ``skip_invalid``; nothing has started.
        ConfigError: no tasks given, the tasks file is missing, a directory or unreadable
            (``TasksFileError``), or both ``resume`` and ``output.overwrite``.
        UnknownEnvironmentError: ``environment`` (``--env``) names no known environment.
        UnknownAgentError: ``agent`` (``--agent``), or the ``agent`` of a file's rows, names
            no known agent (one error for the run, ``skip_invalid`` or not).
        OutputFolderError, PolicyCheckError: ``before_start`` checks (``api.preflight``).
    """
    if isinstance(source, CollectPlan):
        if num_repeats:
            source.num_repeats = num_repeats
        return source
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
        source = check_tasks_file(source)  # before the checks that need no rows
    check_default_environment(config)
    check_default_agent(config)
    key: str | None = None
    if before_start:
        check_output_folder(config)
        if external_policy(config):
            key = check_policy_key(config, require_key)
    check: _EnvironmentCheck | None = None
    if isinstance(source, (str, Path)):
        plan = CollectPlan(str(source), [], repeats)
        check = _EnvironmentCheck(config)
        rows: Iterable[Task] = read_tasks(
            source,
            default_environment=config.environment,
            check_environment=check,
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
        rows = ()
    if isinstance(plan.tasks, list):
        plan.tasks = _read_once(rows, plan, config, check)
        if check is not None:  # a file's rows; in-memory rows' agents fail their episodes
            check_task_agents(plan.tasks, config, Path(plan.source).name)
    if before_start and not plan.empty and external_policy(config):
        probe_policy(config, key)
    return plan


def _read_once(
    rows: Iterable[Task],
    plan: CollectPlan,
    config: RunConfig,
    check: _EnvironmentCheck | None = None,
) -> list[Task]:
    """The first ``limit`` valid tasks; every row checked (to the limit under ``skip_invalid``,
    which stops reading there as ``--limit`` says). ``check``: the rows' environment check,
    whose unknown names add the known ones to the error."""
    tasks: list[Task] = []
    for task in rows:
        if config.limit is None or len(tasks) < config.limit:
            tasks.append(task)
        elif config.skip_invalid:
            break
    if plan.rejects and not config.skip_invalid:
        hint = unknown_environments_hint(config) if check and check.unknown else ""
        raise InvalidTasksError(plan.source, [exc for exc, _ in plan.rejects], hint)
    return tasks


def _parsed(
    rows: Iterable[Task | dict[str, Any]],
    default_environment: str | None,
    on_invalid: Callable[[InvalidTaskError, str | None], None] | None,
) -> Iterator[Task]:
    """In-memory rows as tasks (row ``i`` is "line" ``i``, from 1). An unknown environment (or
    agent) is not checked here: it fails its own episodes, so one row never stops a training
    loop. A ``task_id`` an earlier row took is refused, as in a file (``UniqueTaskIds``)."""
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


class _EnvironmentCheck:
    """Whether a task's environment is known (registered, in the config, or importable),
    remembering the answers: the names it found unknown make the error list the known ones."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.known: set[str] = set()
        self.unknown: set[str] = set()

    def __call__(self, name: str) -> bool:
        if name in self.known:
            return True
        if name in self.unknown:
            return False
        found = environment_known(name, self.config)
        (self.known if found else self.unknown).add(name)
        return found


def environment_checker(config: RunConfig) -> Callable[[str], bool]:
    """Whether a task's environment is known: registered, in the config, or importable."""
    return _EnvironmentCheck(config)


def expand(
    tasks: Iterable[Task], num_repeats: int, skip: set[tuple[str, int]]
) -> Iterator[EpisodeSpec]:
    """One spec per (task, sample index), leaving out those in ``skip`` (already written)."""
    for task in tasks:
        for sample in range(num_repeats):
            if (task.task_id, sample) not in skip:
                yield EpisodeSpec(task, sample)


def nothing_run() -> RunSnapshot:
    """The figures of a collection that started nothing (``CollectPlan.empty``): all zero."""
    return RunSnapshot(elapsed_s=0.0, in_flight=0, episodes_per_s=0.0, total=EnvStats(), by_env={})
