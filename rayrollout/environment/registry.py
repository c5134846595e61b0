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
winner: two entry points, or a config ``path`` for a registered name.

Example:
    >>> spec = environment_spec("weather")  # doctest: +SKIP
    >>> spec.target  # doctest: +SKIP
    'rayrollout.environments.weather.env:WeatherEnv'
"""

from __future__ import annotations

import functools
import importlib
import inspect
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rayrollout.data.config import EnvironmentConfig, load_config
from rayrollout.data.schema import Task
from rayrollout.environment.contract import Environment
from rayrollout.errors import InputError

__all__ = [
    "ENTRY_POINT_GROUP",
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


class UnknownEnvironmentError(InputError, LookupError):
    """A task or config named an environment that nothing registers."""


class DuplicateEnvironmentError(UnknownEnvironmentError):
    """One name registered for two different classes (entry points, or config and registry).

    A ``LookupError`` like an unknown name: the name cannot be resolved to one class.
    """


class EnvironmentArgsError(InputError, TypeError):
    """The config's ``args`` do not fit the environment class's constructor."""


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


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"entry point of {dist.name}" if dist is not None else "entry point"


@functools.cache
def registered_environments() -> dict[str, EnvironmentSpec]:
    """Every environment registered by entry point, by name; two targets for one name raise."""
    specs: dict[str, EnvironmentSpec] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        spec = EnvironmentSpec(name=ep.name, target=ep.value, origin=_origin(ep))
        known = specs.get(ep.name)
        if known is not None and known.target != spec.target:
            raise DuplicateEnvironmentError(
                f"environment '{ep.name}' is registered twice under the '{ENTRY_POINT_GROUP}' "
                f"entry point: '{known.target}' ({known.origin}) and '{spec.target}' "
                f"({spec.origin}). Uninstall one, or register one under another name"
            )
        specs[ep.name] = spec
    return specs


def available_environments() -> dict[str, str]:
    """Every registered environment name and its ``"module:Class"`` target."""
    return {name: spec.target for name, spec in registered_environments().items()}


def environment_spec(name: str, settings: EnvironmentConfig | None = None) -> EnvironmentSpec:
    """The spec of environment ``name``: the config's ``path`` (``settings``), else the
    registered one, else ``name`` itself when it is a ``"module:Class"`` path (of a class
    registered once, that registration: it keeps its registered name); with the config's
    ``args``. Raises ``UnknownEnvironmentError`` (or ``DuplicateEnvironmentError`` when the
    config points a registered name at another class)."""
    registered = registered_environments().get(name)
    args = dict(settings.args) if settings is not None else {}
    if settings is not None and settings.path is not None:
        if registered is not None and registered.target != settings.path:
            raise DuplicateEnvironmentError(
                f"environment '{name}' is registered as '{registered.target}' "
                f"({registered.origin}) and the config's environments.{name}.path names "
                f"'{settings.path}'. Give the config entry another name (tasks then name it), "
                f"or drop its path to use the registered class"
            )
        target, origin = settings.path, f"config environments.{name}.path"
    elif registered is not None:
        target, origin = registered.target, registered.origin
    elif ":" in name:
        # A registered class named by its path goes by its registered name (its label in
        # replies and messages); the caller's settings and args still apply.
        aliases = [s for s in registered_environments().values() if s.target == name]
        if len(aliases) == 1:
            return aliases[0].model_copy(update={"args": args})
        target, origin = name, "its 'module:Class' name"
    else:
        known = ", ".join(sorted(registered_environments())) or "none"
        raise UnknownEnvironmentError(
            f"unknown environment '{name}'. Registered: {known}. Register it under the "
            f"'{ENTRY_POINT_GROUP}' entry point, set environments.{name}.path in the config, "
            "or name it as 'module:Class'."
        )
    return EnvironmentSpec(name=name, target=target, args=args, origin=origin)


def configured_environment(name: str, config_file: str | Path | None) -> EnvironmentSpec:
    """The spec of ``name`` as a run with the YAML config ``config_file`` builds it (its
    ``environments.NAME`` path and args); without a file, as registered. For commands that
    build one environment outside a run (``env serve``, ``env test``)."""
    settings = None if config_file is None else load_config(config_file).environment_config(name)
    return environment_spec(name, settings)


def load_environment(name_or_path: str) -> type[Environment]:
    """Import an environment class by registered name or by ``"module:Class"`` path."""
    return environment_spec(name_or_path).load()


@functools.cache
def _import_class(path: str) -> type[Environment]:
    module_name, _, class_name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise UnknownEnvironmentError(f"cannot import environment '{path}': {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise UnknownEnvironmentError(f"'{path}' is not a subclass of rayrollout.Environment")
    return cls
