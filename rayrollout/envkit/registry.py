"""Environment registry: one ``EnvironmentSpec`` per name, its class imported only when used.

Environments register through the ``rayrollout.environments`` entry-point group (this package
registers its own in pyproject.toml; a third-party package does the same in its own), or in
a run's YAML config under ``environments: {NAME: {path: "module:Class", args: {...}}}``; a
task may also name a class directly as ``"module:Class"``.

The name an environment is registered under is its one name: tasks name it, and hosting,
sessions and the config's ``environments.NAME`` settings are all looked up by it. The
class's own ``name`` attribute is not read (a label at most), so one class can run under
two names with different ``args``, and a class attribute can never pick other settings than
the task's name did (it once did: a ``hosting:`` override was ignored when they differed).

A name registered twice with different targets is an error naming both, never a silent
winner: two entry points, or a config ``path`` for a registered name. Finding, refusing
duplicates and importing are ``rayrollout.plugins``' (shared with agents and policy kinds);
what is environment-specific stays here: the class must be an ``Environment``, the config's
``args`` must fit its constructor, and a registered class named by its path keeps its name.

Example:
    >>> spec = environment_spec("weather")  # doctest: +SKIP
    >>> spec.target  # doctest: +SKIP
    'rayrollout.environments.weather.env:WeatherEnv'
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rayrollout.data.config import EnvironmentConfig, load_config
from rayrollout.data.schema import Task
from rayrollout.envkit.contract import Environment
from rayrollout.envkit.errors import (
    DuplicateEnvironmentError,
    EnvironmentArgsError,
    UnknownEnvironmentError,
)
from rayrollout.plugins import PluginGroup, Registration

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENVIRONMENTS",
    "DuplicateEnvironmentError",
    "EnvironmentArgsError",
    "EnvironmentSpec",
    "UnknownEnvironmentError",
    "available_environments",
    "configured_environment",
    "environment_spec",
    "load_environment",
    "registered_environments",
]

ENTRY_POINT_GROUP = "rayrollout.environments"


ENVIRONMENTS = PluginGroup(
    "environment",
    ENTRY_POINT_GROUP,
    unknown=UnknownEnvironmentError,
    duplicate=DuplicateEnvironmentError,
    settings_key="environments",
)
"""The environments by name (``rayrollout.plugins``: entry points, duplicates, lazy import)."""


class EnvironmentSpec(BaseModel):
    """One environment as registered: its name, its class, the arguments it is built with.

    Frozen and picklable: the engine resolves it once and hands it to Serve replicas.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="The environment's one name (tasks, hosting, config).")
    target: str = Field(description="'module:Class' of the environment class.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the constructor after the task."
    )
    origin: str = Field(default="", description="Where it was registered (for messages).")

    def load(self) -> type[Environment]:
        """Import the class and check that ``args`` fit its constructor."""
        cls = _import_class(self.target)
        if self.args:
            try:
                inspect.signature(cls).bind(None, **self.args)
            except TypeError as exc:
                raise EnvironmentArgsError(
                    f"environments.{self.name}.args {sorted(self.args)} do not fit "
                    f"{self.target}(task, ...): {exc}. Match the args to the constructor's "
                    "keyword parameters"
                ) from None
        return cls

    def create(self, task: Task, cls: type[Environment] | None = None) -> Environment:
        """A new instance for one episode: ``Class(task, **args)`` (``cls``: already loaded)."""
        return (cls or self.load())(task, **self.args)


def _spec(found: Registration, args: dict[str, Any]) -> EnvironmentSpec:
    return EnvironmentSpec(name=found.name, target=found.target, args=args, origin=found.origin)


def registered_environments() -> dict[str, EnvironmentSpec]:
    """Every environment registered by entry point, by name; two targets for one name raise."""
    return {name: _spec(found, {}) for name, found in ENVIRONMENTS.registered().items()}


def available_environments() -> dict[str, str]:
    """Every registered environment name and its ``"module:Class"`` target."""
    return {name: found.target for name, found in ENVIRONMENTS.registered().items()}


def environment_spec(name: str, settings: EnvironmentConfig | None = None) -> EnvironmentSpec:
    """The spec of environment ``name``: the config's ``path`` (``settings``), else the
    registered one, else ``name`` itself when it is a ``"module:Class"`` path (of a class
    registered once, that registration: it keeps its registered name); with the config's
    ``args``. Raises ``UnknownEnvironmentError`` (or ``DuplicateEnvironmentError`` when the
    config points a registered name at another class)."""
    args = dict(settings.args) if settings is not None else {}
    path = settings.path if settings is not None else None
    if path is None and ":" in name:
        registered = ENVIRONMENTS.registered()
        # A registered class named by its path goes by its registered name (its label in
        # replies and messages); the caller's settings and args still apply.
        aliases = [found for found in registered.values() if found.target == name]
        if name not in registered and len(aliases) == 1:
            return _spec(aliases[0], args)
    return _spec(ENVIRONMENTS.resolve(name, path), args)


def configured_environment(name: str, config_file: str | Path | None) -> EnvironmentSpec:
    """The spec of ``name`` as a run with the YAML config ``config_file`` builds it (its
    ``environments.NAME`` path and args); without a file, as registered. For commands that
    build one environment outside a run (``env serve``, ``env test``)."""
    settings = None if config_file is None else load_config(config_file).environment_config(name)
    return environment_spec(name, settings)


def load_environment(name_or_path: str) -> type[Environment]:
    """Import an environment class by registered name or by ``"module:Class"`` path."""
    return environment_spec(name_or_path).load()


def _import_class(path: str) -> type[Environment]:
    cls = ENVIRONMENTS.load(path)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise UnknownEnvironmentError(f"'{path}' is not a subclass of rayrollout.Environment")
    return cls
