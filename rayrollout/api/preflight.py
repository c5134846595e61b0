"""Checks before start: what a ``collect`` can find wrong in a second, before Ray starts.

(Over 400 lines for one job: each check is small, but every one names its fix, and the
checks of one run are read together here: tasks, environments, agents, output, policy.)

Starting Ray, Serve and the policy takes from seconds to minutes, and until this module a
new user's mistakes surfaced only after it: a directory as the tasks file gave a traceback,
an output folder that was a file a hundred lines from inside Ray, a ``--base-url`` with
nothing listening or without its key a run whose every episode ended ``error``, exit 0.
Each check here turns one such mistake into one ``InputError`` that names the fix, raised
before anything starts (the command line prints it as one line, exit 2).

What is checked, in the order ``plan_collect`` runs them (cheap and local first, then the
network, and only then the task rows, so a mistake here is found in seconds whatever the
size of the task set; a tasks file without rows never waits on a probe):

1. the tasks path: it exists, is a file, can be read (``check_tasks_file``);
2. the environment for rows that name none (``--env``): registered, configured or
   importable (``check_default_environment``); rows naming an unknown one are row errors
   of the tasks file, to which ``unknown_environments_hint`` adds the known names; the same
   for the agent (``--agent``, ``check_default_agent``), and the agents a tasks file's rows
   name (``check_task_agents``, once the rows are read: one error for the run, not a row
   error, since a missing agent is a missing install or config entry, never one bad row);
   and each environment the rows name, as it is first met: whether this machine can run
   it (``check_environment_available``: its ``Environment.unavailable_reason``, e.g. the
   code sandbox without bubblewrap), one error for the run, since no episode of it could
   end ``ok``;
3. the output folder: a folder, or creatable, and writable, found by making (and removing)
   a hidden temporary entry, since ``os.access`` answers yes to root on any mode
   (``check_output_folder``);
4. an external policy (kind ``openai``): its base URL, its key's variable set
   (``check_policy_key``), then one ``GET {base_url}/models`` (``probe_policy``): the server
   answers, takes the key (not 401/403), and lists the model when it lists any;
5. each environment served by URL (``--env-url``, ``environments.NAME.url``): one ``GET``
   of the URL answers at all (``probe_environment_urls``).

An endpoint that needs no key says so with ``policy.api_key_env: ""`` in the config (no
variable, no key sent), or by setting the variable to any value (vLLM's convention is
``EMPTY``). Only the command line insists on the key (``require_key``); a Python caller's run
without one learns of it from the probe when the server refuses (401 or 403).

The output folder and the environments' needs are not checked when the run joins a cluster
by address (``ray.address`` or ``RAY_ADDRESS``): the engine that writes the folder and the
replicas that run the environments may be on other nodes, where the path can be fine and the
sandbox installed while this driver's machine has neither. They report such problems themselves.

Example:
    >>> check_tasks_file("tasks.jsonl")  # doctest: +SKIP
    PosixPath('/home/me/tasks.jsonl')
"""

from __future__ import annotations

import http.client
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from rayrollout.agent.registry import ENTRY_POINT_GROUP as AGENT_ENTRY_POINT_GROUP
from rayrollout.agent.registry import UnknownAgentError, agent_spec, registered_agents
from rayrollout.data.config import ConfigError, RunConfig
from rayrollout.data.schema import Task
from rayrollout.environment.registry import (
    ENTRY_POINT_GROUP,
    EnvironmentArgsError,
    UnknownEnvironmentError,
    available_environments,
    environment_spec,
    load_environment,
)
from rayrollout.errors import InputError
from rayrollout.policy.kinds import policy_kind

__all__ = [
    "PROBE_TIMEOUT_S",
    "EnvironmentUnavailableError",
    "EnvironmentUrlError",
    "OutputFolderError",
    "PolicyCheckError",
    "PreflightError",
    "TasksFileError",
    "check_agent",
    "check_default_agent",
    "check_default_environment",
    "check_environment_available",
    "check_output_folder",
    "check_policy_key",
    "check_task_agents",
    "check_tasks_file",
    "environment_known",
    "environment_unavailable",
    "external_policy",
    "known_agents",
    "known_environments",
    "probe_environment_urls",
    "probe_policy",
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


class PreflightError(InputError, ValueError):
    """A check before start failed; nothing was started. The message names the fix."""


class TasksFileError(PreflightError, ConfigError):
    """The tasks path is missing, a directory, or unreadable (a ``ConfigError`` as before)."""


class EnvironmentUnavailableError(PreflightError):
    """An environment the tasks name needs something this machine lacks (a system package,
    privileges); the message is the environment's own line naming the fix."""


class OutputFolderError(PreflightError):
    """The output folder is a file, or cannot be created or written."""


class EnvironmentUrlError(PreflightError):
    """An environment served by URL (``--env-url``) that does not answer."""


class PolicyCheckError(PreflightError):
    """An external policy without a base URL or key, unreachable, refusing the key, or not
    serving the model."""


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
    known = ", ".join(known_environments(config)) or "none"
    return (
        f"Known environments: {known} (`rayrollout env list`); to add one, register it under "
        f"the '{ENTRY_POINT_GROUP}' entry point, set environments.NAME.path in the config, or "
        "name it as 'module:Class'"
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
    settings = config.environment_config(name)
    if settings.url is not None or _joins_a_cluster(config):
        return None
    try:
        cls = environment_spec(name, settings).load()
    except (UnknownEnvironmentError, EnvironmentArgsError):
        return None
    return cls.unavailable_reason()


def check_environment_available(name: str, config: RunConfig) -> None:
    """This machine can run environment ``name`` (see ``environment_unavailable``).

    Raises:
        EnvironmentUnavailableError: it cannot; the message carries the environment's fix.
    """
    reason = environment_unavailable(name, config)
    if reason is not None:
        raise EnvironmentUnavailableError(
            f"environment {name!r} cannot run on this machine: {reason}. Nothing was started"
        )


# Agent names.


def known_agents(config: RunConfig) -> list[str]:
    """The agent names a run can use by name: registered ones and the config's with a path."""
    configured = {name for name, s in config.agent_settings.items() if s.path is not None}
    return sorted(set(registered_agents()) | configured)


def unknown_agents_hint(config: RunConfig) -> str:
    """What to do about an unknown agent name, listing the known ones."""
    known = ", ".join(known_agents(config)) or "none"
    return (
        f"Known agents: {known} (`rayrollout agent list`); to add one, register it under the "
        f"'{AGENT_ENTRY_POINT_GROUP}' entry point, set agent_settings.NAME.path in the config, "
        "or name it as 'module:Class'"
    )


def check_agent(name: str, config: RunConfig, where: str) -> None:
    """Agent ``name`` (named in ``where``) is registered, configured or importable as
    ``"module:Class"``: its module imports and its target is an agent. Its ``args`` are not
    tried here (that builds the agent: ``rayrollout agent test`` does).

    Raises:
        UnknownAgentError: unknown (the message lists the known ones), not importable, or
            a config path that contradicts its registration.
    """
    if name not in known_agents(config) and ":" not in name:
        raise UnknownAgentError(
            f"unknown agent {name!r} in {where}: pass a known one. {unknown_agents_hint(config)}"
        )
    try:
        agent_spec(name, config.agent_config(name))
    except UnknownAgentError as exc:
        raise UnknownAgentError(f"agent {name!r} in {where}: {exc}") from None


def check_default_agent(config: RunConfig) -> None:
    """The agent for rows that name none (``--agent``) must exist, even when every row
    names its own, as ``--env`` must.

    Raises:
        UnknownAgentError: see ``check_agent``.
    """
    if config.agent is not None:
        check_agent(config.agent, config, "--agent (the config's 'agent')")


def check_task_agents(tasks: list[Task], config: RunConfig, source: str) -> None:
    """Every agent the rows of a tasks file name (their ``agent`` field) must exist: a
    missing one would fail each of its episodes after minutes of start-up.

    Raises:
        UnknownAgentError: the first unknown one, with how many rows name it and the first
            of them.
    """
    named: dict[str, list[Task]] = {}
    for task in tasks:
        if task.agent is not None:
            named.setdefault(task.agent, []).append(task)
    for name, rows in named.items():
        where = (
            f"the 'agent' field of {len(rows)} row(s) of {source} "
            f"(first: task_id {rows[0].task_id!r})"
        )
        check_agent(name, config, where)


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
