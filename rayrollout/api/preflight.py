"""The checks of a run; one job: every check of a run, each naming its fix, read together.

What a ``collect`` can find wrong in a second, before Ray starts (``check_setup``, ``probe``):
tasks, environments, agents, output, policy; and what its rows name, as they stream
(``RowEnvironmentCheck``, ``TaskCheck``). Each check is small, but every one names its fix.

Starting Ray, Serve and the policy takes seconds to minutes; each check turns a mistake that
would surface only after it (a directory as the tasks file, a ``--base-url`` with nothing
listening) into one ``InputError`` naming the fix, before anything starts. The checks run
cheap and local first (tasks path, environment and agent names, output folder), then the
network (the policy's key and endpoint, environment URLs), then the task rows. A run joining
a cluster by address skips the folder and machine checks: other nodes do that work.
"""

from __future__ import annotations

import http.client
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from rayrollout.agentkit.registry import ENTRY_POINT_GROUP as AGENT_ENTRY_POINT_GROUP
from rayrollout.agentkit.registry import (
    AgentArgsError,
    UnknownAgentError,
    agent_spec,
    registered_agents,
    resolve_agent,
)
from rayrollout.api.errors import (
    EnvironmentCheckError,
    EnvironmentUnavailableError,
    EnvironmentUrlError,
    OutputFolderError,
    PolicyCheckError,
    PreflightError,
    TasksFileError,
)
from rayrollout.data.config import ConfigError, RunConfig
from rayrollout.data.schema import Task
from rayrollout.data.tasks import CheckedRow, InvalidTaskError, RowRefused, UniqueTaskIds, claim_row
from rayrollout.envkit.contract import Environment
from rayrollout.envkit.registry import (
    ENTRY_POINT_GROUP,
    EnvironmentArgsError,
    UnknownEnvironmentError,
    available_environments,
    environment_spec,
    load_environment,
)
from rayrollout.errors import InputError
from rayrollout.policy.kinds import (
    PAUSE_MODES_A_KIND_MAY_REFUSE,
    CheckedPolicy,
    pause_mode_refusal,
    policy_kind,
)

__all__ = [
    "PROBE_TIMEOUT_S",
    "EnvironmentCheckError",
    "EnvironmentUnavailableError",
    "EnvironmentUrlError",
    "OutputFolderError",
    "PolicyCheckError",
    "PreflightError",
    "RowEnvironmentCheck",
    "TaskCheck",
    "TaskEnvironmentCheck",
    "TasksFileError",
    "check_agent",
    "check_default_agent",
    "check_default_environment",
    "check_environment_available",
    "check_task_environments",
    "check_output_folder",
    "check_policy_key",
    "check_policy_kind",
    "check_setup",
    "check_task_agents",
    "check_tasks_file",
    "detect_server_protocols",
    "environment_config_problem",
    "environment_known",
    "environment_unavailable",
    "external_policy",
    "known_agents",
    "known_environments",
    "probe",
    "probe_environment_urls",
    "probe_policy",
    "server_protocol",
    "unknown_agents_hint",
    "unknown_environments_hint",
]

PROBE_TIMEOUT_S = 5.0
"""Seconds the endpoint probe waits: a live server lists its models in milliseconds."""
BUSY_TIMEOUT_S = 30.0
"""Seconds a second try waits when the first timed out: a server that is there but busy (vLLM
generating on a loaded machine, Serve's proxy behind it) can take seconds to list its
models, and refusing it would stop a run that would have played. A refused connection or an
unknown host is still said at once."""
_MODELS_SHOWN = 10
_BODY_LIMIT = 4 * 1024 * 1024  # a model list is kilobytes; never read a stray huge answer


# Every check that needs no rows, in their order.


def check_setup(
    config: RunConfig,
    policy: CheckedPolicy | InputError,
    *,
    before_start: bool,
    require_key: bool,
) -> tuple[bool, str | None]:
    """The checks that need no rows, cheap and local first: ``--env``, ``--agent`` and the
    policy's kind and settings; with ``before_start``, the output folder and an external
    policy's base URL and key. Returns whether the policy is external (``before_start``
    only; else False) and its key (None: none to send).

    ``policy`` is the kind as the planning asked it once (``check_policy_kind``), or what
    that refused: a refusal is raised here, in its place among the checks.

    Raises:
        UnknownEnvironmentError, UnknownAgentError, AgentArgsError: as
            ``check_default_environment`` and ``check_default_agent``.
        UnknownPolicyKindError, ConfigError: the refusal ``policy`` holds.
        OutputFolderError, PolicyCheckError: ``before_start`` checks.
    """
    check_default_environment(config)
    check_default_agent(config)
    if isinstance(policy, InputError):
        raise policy
    if not before_start:
        return False, None
    check_output_folder(config)
    external = not policy.deploys
    return external, check_policy_key(config, require_key) if external else None


def check_policy_kind(config: RunConfig) -> CheckedPolicy:
    """The run's policy kind, found by name, with the config's policy section checked
    against it, and whether the run deploys it: asked once, before anything starts.

    The kind is asked for facts, never handed the config: its settings model, which the
    section validates its own keys with (``PolicyConfig.settings_as``; the kind's checks are
    that model's validators), and whether it deploys for a config with or without
    ``policy.base_url``. Only a pause mode a kind may refuse (``interrupt``, ``continue``)
    is put to the kind with the config (``policy.kinds.pause_mode_refusal``).

    Raises:
        UnknownPolicyKindError: ``policy.kind`` names no registered kind.
        ConfigError: a setting of the kind is wrong, its checks refuse the section, or it
            cannot take ``training.pause_mode``.
    """
    kind = policy_kind(config.policy.kind)
    config.policy.settings_as(kind.settings_model, checks=False)  # its keys, then its modes
    if config.training.pause_mode in PAUSE_MODES_A_KIND_MAY_REFUSE:
        refusal = pause_mode_refusal(kind, config)
        if refusal is not None:
            raise ConfigError(refusal)
    config.policy.settings_as(kind.settings_model)  # then its checks across the section
    return CheckedPolicy(kind, kind.deploys_with(base_url=bool(config.policy.base_url)))


def probe(config: RunConfig, external: bool, key: str | None) -> None:
    """The network checks before start: an external policy's endpoint, environment URLs,
    then what each environment server speaks (``detect_server_protocols``), once per URL.

    Raises:
        PolicyCheckError, EnvironmentUrlError: as ``probe_policy``, ``probe_environment_urls``.
    """
    if external:
        probe_policy(config, key)
    probe_environment_urls(config)
    detect_server_protocols(config)


# The tasks path.


def check_tasks_file(path: str | Path) -> Path:
    """The tasks file's absolute path, once it is known to be a readable file.

    Raises:
        TasksFileError: missing, a directory (naming task files inside it), or unreadable.
    """
    path = Path(path).absolute()
    if not path.exists():
        raise TasksFileError(
            f"tasks file not found: {path}: pass an existing JSONL or Parquet file"
        )
    if path.is_dir():
        inside = sorted(
            p.name for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".parquet")
        )
        hint = f" (it holds {', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''})"
        raise TasksFileError(
            f"tasks file {path} is a directory: pass one JSONL or Parquet file"
            + (hint if inside else "")
        )
    try:
        with path.open("rb") as file:
            file.read(1)
    except OSError as exc:
        raise TasksFileError(
            f"cannot read tasks file {path}: {exc.strerror or exc}: make it readable "
            "(chmod u+r), or pass another file"
        ) from None
    return path


# Environment names.


def known_environments(config: RunConfig) -> list[str]:
    """The environment names a run can use by name: registered ones and the config's."""
    return sorted(set(available_environments()) | set(config.environments))


def environment_known(name: str, config: RunConfig) -> bool:
    """Whether ``name`` is registered, in the config, or importable as ``"module:Class"``."""
    if name in config.environments or name in available_environments():
        return True
    try:
        load_environment(name)
    except UnknownEnvironmentError:
        return False
    return True


def unknown_environments_hint(config: RunConfig) -> str:
    """What to do about an unknown environment name, listing the known ones."""
    known = known_environments(config)
    return _unknown_hint("environments", known, "env", ENTRY_POINT_GROUP, "environments")


def _unknown_hint(what: str, known: list[str], command: str, group: str, section: str) -> str:
    """What to do about an unknown name of ``what`` (environments, agents): the ``known``
    ones (``rayrollout COMMAND list``), and the ways to add one: entry point ``group``,
    ``SECTION.NAME.path`` in the config, or ``module:Class``."""
    return (
        f"Known {what}: {', '.join(known) or 'none'} (`rayrollout {command} list`); to add "
        f"one, register it under the '{group}' entry point, set {section}.NAME.path in the "
        "config, or name it as 'module:Class'"
    )


def check_default_environment(config: RunConfig) -> None:
    """The environment for rows that name none (``--env``) must exist, even when every row
    names its own: a typo there was silently ignored before.

    Raises:
        UnknownEnvironmentError: the name is not known; the message lists the known ones.
    """
    name = config.environment
    if name is not None and not environment_known(name, config):
        raise UnknownEnvironmentError(
            f"unknown environment {name!r} in --env (the config's 'environment'): pass a "
            f"known one. {unknown_environments_hint(config)}"
        )


def environment_unavailable(name: str, config: RunConfig) -> str | None:
    """Why this machine cannot run environment ``name`` (its ``unavailable_reason``), or None.

    None too where the question is not this machine's: the environment runs on a server
    (``environments.NAME.url``), or the run joins a cluster by address; and where the name
    does not resolve (the checks of names report that).
    """
    cls = _class_on_this_machine(name, config)
    return None if cls is None else cls.unavailable_reason()


def environment_config_problem(name: str, config: RunConfig) -> str | None:
    """What is wrong with environment ``name``'s args (its ``Environment.config_problem``: a
    class that does not import, a URL that does not answer, an unknown id), or None.

    None too where the question is not this machine's (the environment runs on a server
    by ``environments.NAME.url``, or the run joins a cluster by address, whose nodes may
    import what this driver cannot) and where the name does not resolve.
    """
    cls = _class_on_this_machine(name, config)
    if cls is None:
        return None
    return cls.config_problem(dict(config.environment_config(name).args))


def _class_on_this_machine(name: str, config: RunConfig) -> type[Environment] | None:
    """Environment ``name``'s class as this machine loads it, or None where the question is
    not this machine's (a server by ``environments.NAME.url``, a cluster joined by address)
    or the name does not resolve: what ``environment_unavailable`` and
    ``environment_config_problem`` ask of."""
    settings = config.environment_config(name)
    if settings.url is not None or _joins_a_cluster(config):
        return None
    try:
        return environment_spec(name, settings).load()
    except (UnknownEnvironmentError, EnvironmentArgsError):
        return None


def check_environment_available(name: str, config: RunConfig) -> None:
    """This machine can run environment ``name`` (see ``environment_unavailable``), and its
    args name what it can play (``environment_config_problem``).

    Raises:
        EnvironmentUnavailableError: it cannot run here; the message carries the fix.
        EnvironmentCheckError: its args cannot be played; the message carries the fix.
    """
    reason = environment_unavailable(name, config)
    if reason is not None:
        raise EnvironmentUnavailableError(
            f"environment {name!r} cannot run on this machine: {reason}. Nothing was started"
        )
    problem = environment_config_problem(name, config)
    if problem is not None:
        raise EnvironmentCheckError(
            f"environment {name!r}: {_sentence(problem)} Nothing was started"
        )


class RowEnvironmentCheck:
    """Whether a task's environment is known (registered, in the config, or importable),
    remembering the answers: the names it found unknown make the error list the known ones.

    A known one this machine cannot run, met in the head, raises
    ``EnvironmentUnavailableError``: the run's error, and nothing has started. Met past the
    head (``started``: the run is going), it refuses the row (``RowRefused``): a bad row like
    any other, named by its line, which stops the run there or goes to the rejects file with
    ``skip_invalid``; what was submitted before it is played and written."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.started = False
        self.known: set[str] = set()
        self.unknown: set[str] = set()
        self.unavailable: dict[str, str] = {}

    def __call__(self, name: str) -> bool:
        if name in self.unavailable:
            raise RowRefused(self.unavailable[name])
        if name in self.known:
            return True
        if name in self.unknown:
            return False
        found = environment_known(name, self.config)
        if found and self.started:
            reason = environment_unavailable(name, self.config)
            if reason is not None:
                self.unavailable[name] = (
                    f"environment {name!r} cannot run on this machine: {reason}; fix it, "
                    "then run again with --resume"
                )
                raise RowRefused(self.unavailable[name])
        elif found:
            check_environment_available(name, self.config)
        (self.known if found else self.unknown).add(name)
        return found

    def verdict(self, name: str) -> bool | str:
        """Whether environment ``name`` is known, or why a known one is refused
        (``RowRefused``); the run's own errors (``EnvironmentUnavailableError``, ...) raise."""
        try:
            return self(name)
        except RowRefused as refused:
            return str(refused)

    def rows(self, parsed: Iterable[CheckedRow], unique: UniqueTaskIds) -> Iterator[CheckedRow]:
        """Parsed rows (``data.tasks.parse_rows``) with each task's environment judged here
        and its id then claimed (``claim_row``): what ``check_rows`` does with this check,
        the data layer never calling back up to the planning."""
        for source, line, task, raw in parsed:
            if not isinstance(task, InvalidTaskError):
                task = claim_row(unique, source, line, task, self.verdict(task.environment))
            yield source, line, task, raw

    def hint(self) -> str:
        """The known environments, once a name was found unknown; else nothing."""
        return unknown_environments_hint(self.config) if self.unknown else ""


class TaskEnvironmentCheck:
    """Whether each row's environment can play it (``Environment.task_problem``: a GEM id,
    a skyrl-gym ``env_class`` its source registers), asked row by row with each environment
    class loaded once. Rows of an environment served by URL, or of a name that does not
    resolve (the row checks report that), are not asked."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.classes: dict[str, tuple[type[Environment], dict[str, Any]] | None] = {}

    def problem(self, task: Task) -> str | None:
        """Why ``task``'s environment cannot play it, or None."""
        name = task.environment
        if name not in self.classes:
            settings = self.config.environment_config(name)
            found: tuple[type[Environment], dict[str, Any]] | None = None
            if settings.url is None:
                try:
                    found = (environment_spec(name, settings).load(), dict(settings.args))
                except (UnknownEnvironmentError, EnvironmentArgsError):
                    found = None
            self.classes[name] = found
        entry = self.classes[name]
        return None if entry is None else entry[0].task_problem(task, entry[1])


def check_task_environments(tasks: Iterable[Task], config: RunConfig, source: str) -> None:
    """Every row's environment can play it (``TaskEnvironmentCheck``): a mistyped id would
    fail each of its episodes after the start-up.

    Raises:
        EnvironmentCheckError: the first problem, with how many rows share it and the
            first of them.
    """
    check = TaskEnvironmentCheck(config)
    found: dict[str, list[Task]] = {}
    for task in tasks:
        problem = check.problem(task)
        if problem is not None:
            found.setdefault(f"environment {task.environment!r}: {problem}", []).append(task)
    if found:
        problem, rows = next(iter(found.items()))
        raise EnvironmentCheckError(
            f"{problem} ({len(rows)} row(s) of {source}, first: task_id {rows[0].task_id!r}). "
            "Nothing was started"
        )


class TaskCheck:
    """What a streamed row needs beyond its own fields, checked as it is met past the head:
    the agent it names exists (``check_agent``, asked once per name), its
    environment's args can be played (``environment_config_problem``, once per name not
    met in the head) and its environment can play the row (``TaskEnvironmentCheck``: an id
    its source registers). A problem is the run's error (``UnknownAgentError``,
    ``EnvironmentCheckError``), not the row's: the same mistake would fail every row
    sharing it."""

    def __init__(self, config: RunConfig, head: list[Task]) -> None:
        self.config = config
        self.known = {task.agent for task in head if task.agent}
        self.environments = {task.environment for task in head}
        self.rows = TaskEnvironmentCheck(config)

    def __call__(self, task: Task, where: str) -> None:
        if task.agent is not None and task.agent not in self.known:
            check_agent(task.agent, self.config, f"the 'agent' field of {where}")
            self.known.add(task.agent)
        if task.environment not in self.environments:
            self.environments.add(task.environment)
            problem = environment_config_problem(task.environment, self.config)
            if problem is not None:
                raise EnvironmentCheckError(
                    f"environment {task.environment!r} (first named at {where}): {problem}; "
                    "fix it, then run again with --resume"
                )
        problem = self.rows.problem(task)
        if problem is not None:
            raise EnvironmentCheckError(
                f"environment {task.environment!r} at {where}: {problem}; fix the row, then "
                "run again with --resume"
            )


def _sentence(text: str) -> str:
    """``text`` ending as a sentence ends (a question keeps its mark)."""
    text = text.rstrip()
    return text if text.endswith((".", "?", "!")) else text + "."


# Agent names.


def known_agents(config: RunConfig) -> list[str]:
    """The agent names a run can use by name: registered ones and the config's with a path."""
    configured = {name for name, s in config.agent_settings.items() if s.path is not None}
    return sorted(set(registered_agents()) | configured)


def unknown_agents_hint(config: RunConfig) -> str:
    """What to do about an unknown agent name, listing the known ones."""
    known = known_agents(config)
    return _unknown_hint("agents", known, "agent", AGENT_ENTRY_POINT_GROUP, "agent_settings")


def check_agent(name: str, config: RunConfig, where: str) -> None:
    """Agent ``name`` (named in ``where``) is registered, configured or importable as
    ``"module:Class"``: its module imports, its target is an agent, and the config's
    ``agent_settings.NAME.args`` bind to its signature (``AgentSpec.check_args``: nothing is
    built; ``rayrollout agent test`` builds and plays it).

    Raises:
        UnknownAgentError: unknown (the message lists the known ones), not importable, or
            a config path that contradicts its registration.
        AgentArgsError: its args miss one it requires (the message names the config key to
            set) or give one it does not take.
    """
    if name not in known_agents(config) and ":" not in name:
        raise UnknownAgentError(
            f"unknown agent {name!r} in {where}: pass a known one. {unknown_agents_hint(config)}"
        )
    try:
        agent_spec(name, config.agent_config(name)).check_args()
    except UnknownAgentError as exc:
        raise UnknownAgentError(f"agent {name!r} in {where}: {exc}") from None
    except AgentArgsError as exc:
        raise AgentArgsError(f"{exc} (for {where}). Nothing was started") from None


def check_default_agent(config: RunConfig) -> None:
    """The agent for rows that name none (``--agent``) must exist, even when every row
    names its own, as ``--env`` must.

    Raises:
        UnknownAgentError: see ``check_agent``.
    """
    if config.agent is not None:
        check_agent(config.agent, config, "--agent (the config's 'agent')")


def check_task_agents(tasks: list[Task], config: RunConfig, source: str) -> None:
    """Every agent that will play the rows of a tasks file must exist and fit its settings
    (``check_agent``): the one each row resolves to (``resolve_agent``: its ``agent``
    field, else the run's ``--agent``, else its environment's default), as the workers
    resolve it. A missing agent, or one whose required args the config lacks, would fail
    each of its episodes after minutes of start-up.

    Raises:
        UnknownAgentError: the first unknown one, with how many rows it plays and the first
            of them.
        AgentArgsError: the first whose args do not fit, named the same way.
    """
    classes = _EnvironmentClasses(config)
    chosen: dict[tuple[str, str], list[Task]] = {}
    for task in tasks:
        declares = None if task.agent or config.agent else classes.get(task.environment)
        name = resolve_agent(task, config.agent, declares)
        if task.agent:
            by = "the 'agent' field of"
        elif config.agent:
            by = "--agent (the config's 'agent'), playing"
        else:
            by = f"the default agent of environment {task.environment!r}, playing"
        chosen.setdefault((name, by), []).append(task)
    for (name, by), rows in chosen.items():
        where = f"{by} {len(rows)} row(s) of {source} (first: task_id {rows[0].task_id!r})"
        check_agent(name, config, where)


class _EnvironmentClasses:
    """Each environment's class as the workers load it (``remote_environment`` for one served
    by URL), loaded once; None for a name that does not resolve (the row checks say so)."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.classes: dict[str, type[Environment] | None] = {}

    def get(self, name: str) -> type[Environment] | None:
        if name not in self.classes:
            settings = self.config.environment_config(name)
            found: type[Environment] | None = None
            if settings.url is not None:
                from rayrollout.envkit.nemo_gym.client import remote_environment

                found = remote_environment(settings)
            else:
                try:
                    found = environment_spec(name, settings).load()
                except (UnknownEnvironmentError, EnvironmentArgsError):
                    found = None
            self.classes[name] = found
        return self.classes[name]


# The output folder.


def _joins_a_cluster(config: RunConfig) -> bool:
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    return bool(address) and address != "local"


def check_output_folder(config: RunConfig) -> None:
    """The output folder is a folder this machine can write, or can be made; checked by
    trying (a hidden temporary entry, removed at once), and not at all when the run joins
    a cluster by address (its engine may write on another node). Creates nothing.

    Raises:
        OutputFolderError: it is a file, something on its path is a file, or the folder (or
            the nearest existing parent) refuses a new entry.
    """
    if _joins_a_cluster(config):
        return
    path = Path(config.output.dir).absolute()
    fix = "pass another --out (output.dir in the config)"
    if path.exists() and not path.is_dir():
        raise OutputFolderError(f"output folder {path} is a file, not a folder: {fix}")
    if path.is_dir():
        try:
            handle, probe = tempfile.mkstemp(prefix=".rayrollout-check-", dir=path)
            os.close(handle)
            os.unlink(probe)
        except OSError as exc:
            raise OutputFolderError(
                f"output folder {path} is not writable ({exc.strerror or exc}): {fix}, or "
                "make it writable"
            ) from None
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputFolderError(f"cannot create output folder {path}: {parent} is a file: {fix}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rayrollout-check-", dir=parent))
    except OSError as exc:
        raise OutputFolderError(
            f"cannot create output folder {path}: {parent} refuses a new folder "
            f"({exc.strerror or exc}): {fix}, or make {parent} writable"
        ) from None


# An external policy.


def external_policy(config: RunConfig) -> bool:
    """Whether the run uses a policy server it does not deploy (kind ``openai``, or a vLLM
    app already up at ``policy.base_url``). An unknown kind raises
    ``UnknownPolicyKindError`` here, early."""
    return not policy_kind(config.policy.kind).deploys(config)


def check_policy_key(config: RunConfig, require_key: bool) -> str | None:
    """The external policy's base URL is set, and its key (None: none to send).

    Args:
        config: ``policy.base_url`` and ``policy.api_key_env`` are read.
        require_key: A missing key is an error (the command line); else the probe finds
            out whether the server needs one.

    Raises:
        PolicyCheckError: no base URL, or ``require_key`` and the key's variable unset.
    """
    policy = config.policy
    if not policy.base_url:
        raise PolicyCheckError(
            f"policy kind '{policy.kind}' needs a base URL: pass --base-url URL (and --model "
            "NAME), or set policy.base_url in the config"
        )
    if not policy.base_url.startswith(("http://", "https://")):
        raise PolicyCheckError(
            f"--base-url {policy.base_url!r} is not an HTTP URL: pass one like http://host:8000/v1"
        )
    variable = policy.api_key_env
    if not variable:  # api_key_env: "" says the endpoint needs no key
        return None
    key = os.environ.get(variable)
    if not key and require_key:
        raise PolicyCheckError(
            f"no API key for the policy at {policy.base_url}: set {variable} (the variable "
            f"policy.api_key_env names). If the endpoint needs no key, set {variable}=EMPTY, "
            'or policy.api_key_env: "" in the --config file'
        )
    return key or None


def probe_policy(config: RunConfig, key: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One ``GET {base_url}/models`` with the key: the server answers, accepts the key, and
    lists ``policy.model`` if it lists models at all.

    Any other answer (404: no ``/models`` route; 5xx; not a model list) passes: the server
    is there, and the run's own retries judge its completions. Proxies are not used, as
    the workers' HTTP client uses none. The key never appears in a message.

    Raises:
        PolicyCheckError: nothing answers (refused, unknown host, timeout), HTTP 401/403, or
            a model list without the model.
    """
    policy = config.policy
    base = (policy.base_url or "").rstrip("/")
    url = f"{base}/models"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        try:
            with opener.open(request, timeout=timeout_s) as response:
                body = response.read(_BODY_LIMIT)
        except _SILENCE as exc:
            if not _timed_out(exc):
                raise
            timeout_s = BUSY_TIMEOUT_S  # there, perhaps busy: once more, more patiently
            with opener.open(request, timeout=timeout_s) as response:
                body = response.read(_BODY_LIMIT)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code in (401, 403):
            raise PolicyCheckError(_refused(config, key, exc.code)) from None
        return
    except _SILENCE as exc:
        raise PolicyCheckError(
            f"the policy endpoint {base} does not answer (GET {url}: "
            f"{_silence_reason(exc, timeout_s)}): start the "
            "server, or pass the right --base-url (policy.base_url)"
        ) from None
    served = _model_ids(body)
    if served and policy.model not in served:
        shown = ", ".join(served[:_MODELS_SHOWN])
        more = f" and {len(served) - _MODELS_SHOWN} more" if len(served) > _MODELS_SHOWN else ""
        raise PolicyCheckError(
            f"model {policy.model!r} is not served at {base} (GET /models lists {shown}{more}): "
            "pass --model with one of them (policy.model)"
        )


def probe_environment_urls(config: RunConfig, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One ``GET`` of each environment URL in the config: any HTTP answer passes (a NeMo Gym
    resources server answers 404 at its root); only silence is refused.

    Raises:
        EnvironmentUrlError: nothing answers at one of them (refused, unknown host, timeout).
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for name, settings in sorted(config.environments.items()):
        if settings.url is None:
            continue
        try:
            opener.open(settings.url, timeout=timeout_s).close()
        except urllib.error.HTTPError as exc:
            exc.close()
        except _SILENCE as exc:
            raise EnvironmentUrlError(
                f"environment {name!r} at {settings.url} does not answer "
                f"(GET: {_silence_reason(exc, timeout_s)}): start "
                f"the server, or pass the right --env-url (environments.{name}.url)"
            ) from None


def detect_server_protocols(config: RunConfig, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fill ``environments.NAME.protocol`` where it is unset, from the routes the server at
    its URL lists (``server_protocol``): asked once per URL, before the run, so that the
    agent of a Gymnasium-style server's rows follows from it (``remote_environment``) and a
    user who named none needs no ``--agent``. A server that lists nothing is left unset
    (the episodes still find its kind by its ``/seed_session`` answer)."""
    found: dict[str, str | None] = {}
    for settings in config.environments.values():
        if settings.url is None or settings.protocol is not None:
            continue
        if settings.url not in found:
            found[settings.url] = server_protocol(settings.url, timeout_s)
        if found[settings.url] == "gymnasium":
            settings.protocol = "gymnasium"
        elif found[settings.url] == "resources_server":
            settings.protocol = "resources_server"


def server_protocol(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """What the NeMo Gym server at ``url`` speaks, by the routes its ``GET /openapi.json``
    lists (NeMo Gym's servers are FastAPI apps): ``"resources_server"`` with
    ``/seed_session``, ``"gymnasium"`` with ``/reset`` and ``/step`` and no
    ``/seed_session``; None when it lists none of them, or lists nothing."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url.rstrip('/')}/openapi.json", timeout=timeout_s) as response:
            answer: Any = orjson.loads(response.read(_BODY_LIMIT))
    except urllib.error.HTTPError as exc:
        exc.close()
        return None
    except _SILENCE:  # silence, or not JSON (ValueError)
        return None
    paths = answer.get("paths") if isinstance(answer, dict) else None
    if not isinstance(paths, dict):
        return None
    if "/seed_session" in paths:
        return "resources_server"
    if "/reset" in paths and "/step" in paths:
        return "gymnasium"
    return None


_SILENCE = (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)
"""What a probe's ``GET`` raises when nothing answers (an HTTP error status is an answer)."""


def _timed_out(exc: BaseException) -> bool:
    """Whether a probe's silence was its timeout (not a refusal or an unknown host)."""
    return isinstance(getattr(exc, "reason", exc), TimeoutError)


def _silence_reason(exc: BaseException, timeout_s: float) -> str:
    """Why a probe got no answer, in a few words: the timeout, or the socket's own reason."""
    reason = getattr(exc, "reason", exc)
    if _timed_out(exc):
        return f"no answer within {timeout_s:g} s"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason)


def _refused(config: RunConfig, key: str | None, status: int) -> str:
    base, variable = (config.policy.base_url or "").rstrip("/"), config.policy.api_key_env
    if key:
        return (
            f"the policy endpoint {base} refused the API key in {variable} (HTTP {status} on "
            f"GET /models): set {variable} to a key it accepts"
        )
    where = f"set {variable}" if variable else "set policy.api_key_env to the variable holding it"
    return (
        f"the policy endpoint {base} needs an API key (HTTP {status} on GET /models, none "
        f"was sent): {where}"
    )


def _model_ids(body: bytes) -> list[str]:
    """The ids of an OpenAI model list (``{"data": [{"id": ...}]}``); empty for anything else."""
    try:
        answer: Any = orjson.loads(body)
    except ValueError:
        return []
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
