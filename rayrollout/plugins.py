"""Plugins found by name: the one mechanism behind the environment, agent and policy-kind
registries.

A ``PluginGroup`` reads one entry-point group (``rayrollout.environments``,
``rayrollout.agents``, ``rayrollout.policies``), refuses a name with two targets, resolves a
name (config ``path``, registration, ``"module:attr"``) and imports a target only when asked,
so a package adds a plugin by declaring an entry point and rayrollout never names it.

May import: the standard library and ``rayrollout.errors``; the registries of every part
build on it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from rayrollout.errors import InputError

__all__ = ["BUILT_IN_PACKAGES", "PluginGroup", "Registration"]

BUILT_IN_PACKAGES = ("environments", "deployments", "agents")
"""The built-in plugins' folders, ``rayrollout.<name>``: they register through the same entry
points as any package's, and the core never imports them by name (``tests/test_layers.py``)."""


@dataclass(frozen=True)
class Registration:
    """One plugin as found: its name, its ``"module:attr"`` target, where it came from."""

    name: str
    """The one name tasks, flags and the config know it by."""
    target: str
    """``"module:attr"`` of what it is (a class, a function, a spec object)."""
    origin: str
    """Where it was registered, for messages: ``entry point of <dist>``, the config key."""


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"entry point of {dist.name}" if dist is not None else "entry point"


class PluginGroup:
    """The plugins of one entry-point group, by name: found once, imported when asked for.

    Args:
        noun: What one plugin is called in messages (``"environment"``, ``"policy kind"``).
        group: The entry-point group that registers them.
        unknown: The error raised for a name nothing registers and a target that does not
            import (an ``InputError``: the user named it).
        duplicate: The error raised for one name with two targets (default: ``unknown``).
        settings_key: The config section whose ``NAME.path`` may name a target
            (``"environments"``); None where the config names none.
        by_path: Whether a ``"module:attr"`` name stands for itself when nothing registers it.
        built_in: Names registered by rayrollout itself, before any entry point.
        registers: What the unknown-name message tells a user to register (``"it"``).
    """

    def __init__(
        self,
        noun: str,
        group: str,
        *,
        unknown: type[InputError],
        duplicate: type[InputError] | None = None,
        settings_key: str | None = None,
        by_path: bool = True,
        built_in: Mapping[str, str] | None = None,
        registers: str = "it",
    ) -> None:
        self.noun = noun
        self.group = group
        self.unknown = unknown
        self.duplicate = duplicate or unknown
        self.settings_key = settings_key
        self.by_path = by_path
        self.built_in = dict(built_in or {})
        self.registers = registers
        self._registered: dict[str, Registration] | None = None
        self._loaded: dict[str, Any] = {}

    def registered(self) -> dict[str, Registration]:
        """Every registered plugin by name (built in, then entry points); read once."""
        if self._registered is None:
            found = {
                name: Registration(name, target, "built in")
                for name, target in self.built_in.items()
            }
            for ep in entry_points(group=self.group):
                entry = Registration(ep.name, ep.value, _origin(ep))
                known = found.get(ep.name)
                if known is not None and known.target != entry.target:
                    raise self.duplicate(
                        f"{self.noun} '{ep.name}' is registered twice under the '{self.group}' "
                        f"entry point: '{known.target}' ({known.origin}) and '{entry.target}' "
                        f"({entry.origin}). Uninstall one, or register one under another name"
                    )
                found[ep.name] = entry
            self._registered = found
        return dict(self._registered)

    def resolve(self, name: str, path: str | None = None) -> Registration:
        """What ``name`` stands for: ``path`` (the config's ``NAME.path``), else the
        registered plugin, else ``name`` itself as ``"module:attr"``. Raises ``duplicate``
        for a ``path`` that points a registered name elsewhere, ``unknown`` for a name
        nothing registers."""
        registered = self.registered().get(name)
        if path is not None:
            where = f"{self.settings_key}.{name}.path"
            if registered is not None and registered.target != path:
                raise self.duplicate(
                    f"{self.noun} '{name}' is registered as '{registered.target}' "
                    f"({registered.origin}) and the config's {where} names '{path}'. Give the "
                    f"config entry another name (tasks then name it), or drop its path to use "
                    f"the registered {self.noun}"
                )
            return Registration(name, path, f"config {where}")
        if registered is not None:
            return registered
        if self.by_path and ":" in name:
            return Registration(name, name, "its 'module:Class' name")
        known = ", ".join(sorted(self.registered())) or "none"
        how = f"Register {self.registers} under the '{self.group}' entry point"
        if self.settings_key is not None:
            how += f", set {self.settings_key}.{name}.path in the config"
        if self.by_path:
            how += ", or name it as 'module:Class'"
        raise self.unknown(f"unknown {self.noun} '{name}'. Registered: {known}. {how}")

    def load(self, target: str, name: str | None = None) -> Any:
        """Import ``target`` (``"module:attr"``) the first time it is asked for; raises
        ``unknown`` naming it (and ``name``, where that differs) when it does not import."""
        if target in self._loaded:
            return self._loaded[target]
        module_name, _, attribute = target.partition(":")
        try:
            value = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as exc:
            what = f"'{name}' from '{target}'" if name and name != target else f"'{target}'"
            raise self.unknown(f"cannot import {self.noun} {what}: {exc}") from exc
        self._loaded[target] = value
        return value

    def clear(self) -> None:
        """Forget what was found and imported (tests that change the entry points)."""
        self._registered = None
        self._loaded.clear()
