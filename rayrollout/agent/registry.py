"""Agent registry: one ``AgentSpec`` per name, found the way environments are.

Agents register through the ``rayrollout.agents`` entry-point group (this package registers
its own in pyproject.toml: ``tool_loop``, ``context_budget``, ``simulated_user``,
``program``, ``nemo_gym``), or in a run's YAML under ``agent_settings: {NAME: {path:
"module:Class", args: {...}}}``; a task or ``--agent`` may also name one as
``"module:Class"`` (or ``"module:function"`` for an async function agent). A name
registered twice with different targets is an error naming both.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rayrollout.agent.contract import Agent, FunctionAgent
from rayrollout.data.config import AgentSettings
from rayrollout.errors import InputError

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentArgsError",
    "AgentSpec",
    "UnknownAgentError",
    "agent_spec",
    "registered_agents",
]

ENTRY_POINT_GROUP = "rayrollout.agents"


class UnknownAgentError(InputError, LookupError):
    """A task, flag or config named an agent that nothing registers (or two things do)."""


class AgentArgsError(InputError, TypeError):
    """The config's ``args`` do not fit the agent's constructor (or function)."""


class AgentSpec(BaseModel):
    """One agent as registered: its name, its target, the arguments it is built with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="The agent's one name (tasks, --agent, config).")
    target: str = Field(description="'module:Class' of the agent (or 'module:function').")
    args: dict[str, Any] = Field(default_factory=dict, description="Constructor keywords.")
    origin: str = Field(default="", description="Where it was registered (for messages).")

    def create(self) -> Agent:
        """A new agent instance (one per agent actor plays all of its episodes)."""
        target = _import_target(self.target)
        try:
            if isinstance(target, type):
                inspect.signature(target).bind(**self.args)
                return target(**self.args)
            inspect.signature(target).bind(None, **self.args)
            return FunctionAgent(target, **self.args)
        except TypeError as exc:
            raise AgentArgsError(
                f"agent_settings.{self.name}.args {sorted(self.args)} do not fit "
                f"{self.target}: {exc}. Match the args to its keyword parameters"
            ) from None

    def describe(self) -> str:
        """The agent's first docstring line (for ``agent list``)."""
        doc = inspect.getdoc(_import_target(self.target)) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


@functools.cache
def registered_agents() -> dict[str, AgentSpec]:
    """Every agent registered by entry point, by name; two targets for one name raise."""
    specs: dict[str, AgentSpec] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        origin = f"entry point of {dist.name}" if dist is not None else "entry point"
        spec = AgentSpec(name=ep.name, target=ep.value, origin=origin)
        known = specs.get(ep.name)
        if known is not None and known.target != spec.target:
            raise UnknownAgentError(
                f"agent '{ep.name}' is registered twice under the '{ENTRY_POINT_GROUP}' entry "
                f"point: '{known.target}' ({known.origin}) and '{spec.target}' ({spec.origin}). "
                "Uninstall one, or register one under another name"
            )
        specs[ep.name] = spec
    return specs


def agent_spec(name: str, settings: AgentSettings | None = None) -> AgentSpec:
    """The spec of agent ``name``: the config's ``path``, else the registered one, else
    ``name`` itself as ``"module:Class"``; with the config's ``args``. Raises
    ``UnknownAgentError``."""
    registered = registered_agents().get(name)
    args = dict(settings.args) if settings is not None else {}
    if settings is not None and settings.path is not None:
        if registered is not None and registered.target != settings.path:
            raise UnknownAgentError(
                f"agent '{name}' is registered as '{registered.target}' ({registered.origin}) "
                f"and the config's agent_settings.{name}.path names '{settings.path}'. Give "
                "the config entry another name, or drop its path to use the registered agent"
            )
        target, origin = settings.path, f"config agent_settings.{name}.path"
    elif registered is not None:
        target, origin = registered.target, registered.origin
    elif ":" in name:
        target, origin = name, "its 'module:Class' name"
    else:
        known = ", ".join(sorted(registered_agents())) or "none"
        raise UnknownAgentError(
            f"unknown agent '{name}'. Registered: {known}. Register it under the "
            f"'{ENTRY_POINT_GROUP}' entry point, set agent_settings.{name}.path in the config, "
            "or name it as 'module:Class'"
        )
    spec = AgentSpec(name=name, target=target, args=args, origin=origin)
    _import_target(spec.target)  # an unknown module or class is refused here, by name
    return spec


@functools.cache
def _import_target(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UnknownAgentError(f"cannot import agent '{path}': {exc}") from exc
    if isinstance(target, type):
        if not issubclass(target, Agent):
            raise UnknownAgentError(f"'{path}' is not a subclass of rayrollout.agent.Agent")
    elif not inspect.iscoroutinefunction(target):
        raise UnknownAgentError(
            f"'{path}' is neither an Agent subclass nor an async function play(episode)"
        )
    return target
