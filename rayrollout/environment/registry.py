"""Environment registry: names map to ``"module:Class"`` strings, imported only when used.

Environments register through the ``rayrollout.environments`` entry-point group (this package
registers its own in pyproject.toml; a third-party package does the same in its own), or in
a run's YAML config under ``environments: {NAME: {path: "module:Class"}}``.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points

from rayrollout.environment import Environment

__all__ = ["UnknownEnvironmentError", "available_environments", "load_environment"]

ENTRY_POINT_GROUP = "rayrollout.environments"


class UnknownEnvironmentError(LookupError):
    """A task or config named an environment that nothing registers."""


@functools.cache
def available_environments() -> dict[str, str]:
    """Every registered environment name and its ``"module:Class"`` path."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_environment(name_or_path: str, extra: dict[str, str] | None = None) -> type[Environment]:
    """Import an environment class by registered name or by ``"module:Class"`` path."""
    registry = {**available_environments(), **(extra or {})}
    path = registry.get(name_or_path, name_or_path)
    if ":" not in path:
        known = ", ".join(sorted(registry)) or "none"
        raise UnknownEnvironmentError(
            f"unknown environment '{name_or_path}'. Registered: {known}. Register it under the "
            f"'{ENTRY_POINT_GROUP}' entry point, or name it as 'module:Class'."
        )
    return _import_class(path)


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
