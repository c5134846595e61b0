"""What one ``collect`` runs: its checks before start, then its tasks streamed and checked.

``RolloutEngine.collect`` and ``rayrollout collect`` both go through here, so a Python caller
gets what the command line gets. ``plan_collect`` runs the checks that need no rows
(``api.preflight``), then reads and checks the first ``HEAD_ROWS`` rows, all before Ray
starts; ``CollectPlan.open_output`` runs once the engine holds the folder's lock (old parts,
rejects, resume keys); ``CollectPlan.specs`` streams the rest as the engine's queue takes
them, so a bad row past the head ends the run where it is met unless ``skip_invalid``.
Only digests are kept per task, so the driver's memory is flat in the number of tasks.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from rayrollout.api.collect_plan import (
    MAX_ERRORS_SHOWN,
    CollectPlan,
    InvalidTasksError,
    OutputNotEmptyError,
    expand,
    refuse_old_parts,
)
from rayrollout.api.preflight import (
    RowEnvironmentCheck,
    TaskCheck,
    TasksFileError,
    check_policy_kind,
    check_setup,
    check_task_agents,
    check_task_environments,
    check_tasks_file,
    probe,
)
from rayrollout.data.config import ConfigError, RunConfig
from rayrollout.data.schema import Task
from rayrollout.data.task_shards import ShardSet, is_shard_set
from rayrollout.data.tasks import (
    CheckedRow,
    InvalidTaskError,
    SourceRow,
    UniqueTaskIds,
    check_rows,
    iter_task_rows,
    parse_rows,
)
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import EnvStats
from rayrollout.errors import InputError
from rayrollout.policy.kinds import CheckedPolicy

__all__ = [
    "HEAD_ROWS",
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

HEAD_ROWS = 1000
"""Rows read and checked before anything starts (about 0.1 s of reading): all of a small
file, the first of a large one."""
_COUNT_CHUNK = 1 << 20


TaskSource = str | Path | Iterable[Task | dict[str, Any]] | CollectPlan
"""A tasks file (JSONL or Parquet), a shard set (a directory or glob of them), task rows
(``Task`` objects or row dicts), or a plan ``plan_collect`` already made (the command line
plans, and checks, before it builds the engine; the engine's ``collect`` then runs that plan
instead of reading the source again)."""


def plan_collect(
    source: TaskSource | None,
    config: RunConfig,
    num_repeats: int | None = None,
    *,
    before_start: bool = False,
    require_key: bool = False,
    policy: CheckedPolicy | None = None,
) -> CollectPlan:
    """Check a collection's setup, then its first rows, before anything starts.

    The checks run cheap and local first, the network next, the rows last (``api.preflight``):
    the tasks path, ``--env``, ``--agent``, the output folder and the policy's key; then one
    row is read (a source without rows plans nothing and probes nothing); then one probe
    of an external policy's endpoint and of each environment URL; then the head of the rows
    (and the agents its rows name).

    Args:
        source: A tasks file, a shard set (a directory or glob), a list of rows, or an
            iterator of rows (streamed, not checked up front); None takes the config's
            ``tasks``. A ``CollectPlan`` is returned as it is (checked when it was made).
        config: ``environment`` and ``agent`` (rows that name none), ``skip_invalid``,
            ``limit``, the registered ``environments`` and ``agent_settings`` are read from it.
        num_repeats: Samples per task (default: the config's).
        before_start: Nothing is started yet: also check the output folder, an external
            policy and the environments' URLs (``RolloutEngine.collect`` on an engine not yet
            started, the command line).
        require_key: An external policy without its key's variable set is an error (the
            command line); else a server that refuses to answer without one is.
        policy: The policy kind as already checked for this config (``RolloutEngine``'s);
            None: asked here, once (``api.preflight.check_policy_kind``), and kept as the
            plan's ``policy`` for the engine that runs it.

    Raises:
        InvalidTasksError: bad rows in the head and not ``skip_invalid``; nothing has started.
        ConfigError: no tasks given, the tasks file is missing, a directory without shards or
            unreadable (``TasksFileError``), both ``resume`` and ``output.overwrite``, or a
            policy setting its kind refuses (``api.preflight.check_policy_kind``).
        UnknownEnvironmentError: ``environment`` (``--env``) names no known environment.
        UnknownAgentError: ``agent`` (``--agent``), or the ``agent`` of the head's rows, names
            no known agent (one error for the run, ``skip_invalid`` or not).
        UnknownPolicyKindError: ``policy.kind`` (``--policy``) names no registered kind.
        EnvironmentCheckError: an environment's args, or what the head's rows name of it
            (a GEM id, a skyrl-gym ``env_class``), cannot be played (one error for the run).
        OutputFolderError, PolicyCheckError, EnvironmentUrlError: ``before_start`` checks.
    """
    if isinstance(source, CollectPlan):
        if num_repeats:
            source.num_repeats = num_repeats
        return source
    checked: CheckedPolicy | InputError = policy if policy is not None else _ask_policy(config)
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
    shards: ShardSet | None = None
    if isinstance(source, (str, Path)) and is_shard_set(source):
        try:
            shards = ShardSet(source)
        except FileNotFoundError as exc:
            raise TasksFileError(str(exc)) from None
    elif isinstance(source, (str, Path)):
        source = check_tasks_file(source)  # before the checks that need no rows
    external, key = check_setup(config, checked, before_start=before_start, require_key=require_key)
    plan = CollectPlan("<rows>", repeats, limit=config.limit, skip_invalid=config.skip_invalid)
    plan.policy = checked if isinstance(checked, CheckedPolicy) else None
    if shards is not None or isinstance(source, (str, Path)):
        plan.source = shards.spec if shards is not None else str(source)
        raw = shards.local_rows(HEAD_ROWS) if shards is not None else _file_rows(Path(plan.source))
        first = next(raw, None)  # one row read: a source without rows probes nothing
        if first is None:
            return plan
        if before_start:
            probe(config, external, key)
        check = RowEnvironmentCheck(config)
        parsed = parse_rows(
            itertools.chain([first], raw),
            default_environment=config.environment,
            shards=shards is not None,
            base_dir=None if shards is not None else Path(plan.source).parent,
        )
        rows = check.rows(parsed, plan.ids)  # each environment judged here, then the id
        plan._hint = check.hint
        _read_head(plan, rows, HEAD_ROWS)
        check.started = True  # the rest is read once the run has started
        check_task_agents(plan.head, config, Path(plan.source).name)
        check_task_environments(plan.head, config, Path(plan.source).name)
        plan._checks = TaskCheck(config, plan.head)
        if not plan.complete:
            if shards is not None:
                plan._open_rest = _shard_rest(shards, config, check, plan.ids)
            else:
                plan._rest = rows
            _count_in_background(plan, shards, Path(plan.source))
        return plan
    if isinstance(source, Sequence) and not source:
        return plan  # no rows: nothing to start, nothing to probe
    if before_start:
        probe(config, external, key)
    # In memory: a row's unknown environment or agent fails its own episodes, so one row
    # never stops a training loop; ids are unique as in a file (row i is "line" i).
    in_memory: Iterator[SourceRow] = (
        ("<tasks>", i, row, None) for i, row in enumerate(cast(Iterable[Any], source), start=1)
    )
    rows = check_rows(in_memory, default_environment=config.environment, unique=plan.ids)
    if isinstance(source, Sequence):  # a list: checked whole before anything starts
        _read_head(plan, rows, None)
    else:  # an iterator: streamed; a bad row stops the run where it is met
        plan.complete = False
        plan._rest = rows
    return plan


def _ask_policy(config: RunConfig) -> CheckedPolicy | InputError:
    """The run's policy kind, asked once before the checks (``check_policy_kind``), or what
    it refused: ``check_setup`` raises a refusal in its place, after ``--env`` and
    ``--agent``, so the first error a user meets is the same whichever check asked first."""
    try:
        return check_policy_kind(config)
    except InputError as exc:
        return exc


def _read_head(plan: CollectPlan, rows: Iterator[CheckedRow], most: int | None) -> None:
    """Read up to ``most`` rows (None: all) into the plan's head, to ``limit`` valid ones;
    ``complete`` says whether the source ended there (or the limit was reached). Bad rows
    raise ``InvalidTasksError`` together, unless ``skip_invalid``."""
    count = 0
    plan.complete = False
    while most is None or count < most:
        if plan.limit is not None and len(plan.head) >= plan.limit:
            plan.complete = True
            break
        item = next(rows, None)
        if item is None:
            plan.complete = True
            break
        count += 1
        _, _, task, raw = item
        if isinstance(task, InvalidTaskError):
            plan.reject(task, raw)
        else:
            plan.head.append(task)
    if plan.rejected and not plan.skip_invalid:
        errors = [exc for exc, _ in plan.rejects]
        raise InvalidTasksError(plan.source, errors, plan._hint(), total=plan.rejected)


def _file_rows(path: Path) -> Iterator[SourceRow]:
    """A file's rows as read, named by the file."""
    return ((path.name, line, row, raw) for line, row, raw in iter_task_rows(path))


def _shard_rest(
    shards: ShardSet, config: RunConfig, check: RowEnvironmentCheck, unique: UniqueTaskIds
) -> Callable[[], Iterator[CheckedRow]]:
    """What opens the rows after the head, through Ray Data, checked with the head's checks
    (one id set across the whole set); called when the tasks start streaming, Ray up."""

    def open_rest() -> Iterator[CheckedRow]:
        parsed = parse_rows(shards.stream(), default_environment=config.environment, shards=True)
        return check.rows(parsed, unique)

    return open_rest


def _count_in_background(plan: CollectPlan, shards: ShardSet | None, path: Path) -> None:
    """Count the source's rows for the progress bar in a thread (``plan.rows``), holding
    nothing per row: a Parquet file's or Parquet shard set's footers, a JSONL file's lines
    (a JSONL shard set is not counted: that would read every byte in the driver)."""

    def count() -> None:
        try:
            plan.rows = shards.count_rows() if shards is not None else _count_rows(path)
        except OSError:
            pass  # the bar counts without a total; the run itself reports a file it cannot read

    threading.Thread(target=count, name="count-task-rows", daemon=True).start()


def _count_rows(path: Path) -> int:
    """Rows of one tasks file: a Parquet footer's count, or a JSONL file's lines (blank
    lines counted too: an estimate for the progress bar)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    lines, last = 0, b"\n"
    with path.open("rb") as file:
        while chunk := file.read(_COUNT_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def nothing_run() -> RunSnapshot:
    """The figures of a collection that started nothing (``CollectPlan.empty``): all zero."""
    return RunSnapshot(elapsed_s=0.0, in_flight=0, episodes_per_s=0.0, total=EnvStats(), by_env={})
