"""Agent registry: one ``AgentSpec`` per name, found the way environments are.

Agents register through the ``rayrollout.agents`` entry-point group (this package registers
its own in pyproject.toml: ``tool_loop``, ``context_budget``, ``simulated_user``,
``program``, ``nemo_gym``), or in a run's YAML under ``agent_settings: {NAME: {path:
"module:Class", args: {...}}}``; a task or ``--agent`` may also name one as
``"module:Class"`` (or ``"module:function"`` for an async function agent). A name
registered twice with different targets is an error naming both. Finding, refusing
duplicates and importing are ``rayrollout.plugins``' (shared with environments and policy
kinds); what is agent-specific stays here: the target must be an ``Agent`` subclass or an
async function, and the config's ``args`` must fit it.

Which agent plays a task is ``resolve_agent``'s one answer, for the worker that plays it and
the checks before a run alike: the row's ``agent``, else the run's (the config's ``agent:``,
``--agent``), else what the environment declares (``Environment.agent_for``: ``reset_step``
for the reset/step sources, ``verifiers`` for verifiers environments), else ``tool_loop``.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rayrollout.agentkit.contract import Agent, FunctionAgent
from rayrollout.agentkit.errors import AgentArgsError, UnknownAgentError
from rayrollout.data.config import DEFAULT_AGENT, AgentSettings
from rayrollout.data.schema import Task
from rayrollout.envkit.contract import Environment
from rayrollout.plugins import PluginGroup

__all__ = [
    "AGENTS",
    "ENTRY_POINT_GROUP",
    "AgentArgsError",
    "AgentSpec",
    "UnknownAgentError",
    "agent_spec",
    "registered_agents",
    "resolve_agent",
]

ENTRY_POINT_GROUP = "rayrollout.agents"


AGENTS = PluginGroup(
    "agent", ENTRY_POINT_GROUP, unknown=UnknownAgentError, settings_key="agent_settings"
)
"""The agents by name (``rayrollout.plugins``: entry points, duplicates, lazy import)."""


class AgentSpec(BaseModel):
    """One agent as registered: its name, its target, the arguments it is built with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="The agent's one name (tasks, --agent, config).")
    target: str = Field(description="'module:Class' of the agent (or 'module:function').")
    args: dict[str, Any] = Field(default_factory=dict, description="Constructor keywords.")
    origin: str = Field(default="", description="Where it was registered (for messages).")

    def create(self) -> Agent:
        """A new agent instance (one per worker actor plays all of its episodes)."""
        target = self.check_args()
        try:
            if isinstance(target, type):
                return target(**self.args)
            return FunctionAgent(target, **self.args)
        except TypeError as exc:
            raise AgentArgsError(
                f"agent_settings.{self.name}.args {sorted(self.args)} do not fit "
                f"{self.target}: {exc}. Match the args to its keyword parameters"
            ) from None

    def check_args(self) -> Any:
        """The agent's target, once the config's ``args`` bind to its signature (its
        constructor, or a function's parameters after the episode): what ``create`` checks
        before building, and the checks before a run without building anything.

        Raises:
            AgentArgsError: an argument the agent requires is missing (the message names
                the config key to set), or one it does not take is given.
        """
        target = _import_target(self.target)
        signature = inspect.signature(target)
        try:
            if isinstance(target, type):
                signature.bind(**self.args)
            else:
                signature.bind(None, **self.args)
        except TypeError as exc:
            params = list(signature.parameters.values())[0 if isinstance(target, type) else 1 :]
            missing = [
                p.name
                for p in params
                if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.name not in self.args
            ]
            if missing:
                keys = ", ".join(f"agent_settings.{self.name}.args.{name}" for name in missing)
                raise AgentArgsError(
                    f"agent {self.name!r} ({self.target}) needs {', '.join(map(repr, missing))}: "
                    f"set {keys} in the run's config"
                ) from None
            raise AgentArgsError(
                f"agent_settings.{self.name}.args {sorted(self.args)} do not fit "
                f"{self.target}: {exc}. Match the args to its keyword parameters"
            ) from None
        return target

    def describe(self) -> str:
        """The agent's first docstring line (for ``agent list``)."""
        doc = inspect.getdoc(_import_target(self.target)) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


def registered_agents() -> dict[str, AgentSpec]:
    """Every agent registered by entry point, by name; two targets for one name raise."""
    return {
        name: AgentSpec(name=name, target=found.target, origin=found.origin)
        for name, found in AGENTS.registered().items()
    }


def agent_spec(name: str, settings: AgentSettings | None = None) -> AgentSpec:
    """The spec of agent ``name``: the config's ``path``, else the registered one, else
    ``name`` itself as ``"module:Class"``; with the config's ``args``. Raises
    ``UnknownAgentError``."""
    args = dict(settings.args) if settings is not None else {}
    found = AGENTS.resolve(name, settings.path if settings is not None else None)
    spec = AgentSpec(name=name, target=found.target, args=args, origin=found.origin)
    _import_target(spec.target)  # an unknown module or class is refused here, by name
    return spec


def resolve_agent(
    task: Task, run_agent: str | None, environment: type[Environment] | None = None
) -> str:
    """The name of the agent that plays ``task``: the row's own ``agent``, else the run's
    (``run_agent``: the config's ``agent:`` or ``--agent``), else the one its environment
    class declares for it (``Environment.agent_for``), else the built-in ``tool_loop``.

    A user's explicit choice always wins; the environment's default only fills the gap, so
    naming a reset/step environment is enough to play it with the ``reset_step`` agent.

    Example:
        >>> from rayrollout.envkit.reset_step.gem import GemEnvironment
        >>> prompt = [{"role": "user", "content": "Go."}]
        >>> task = Task.model_validate({"task_id": "t", "environment": "gem", "prompt": prompt})
        >>> resolve_agent(task, None, GemEnvironment)
        'reset_step'
        >>> resolve_agent(task, "tool_loop", GemEnvironment)
        'tool_loop'
    """
    if task.agent:
        return task.agent
    if run_agent:
        return run_agent
    declared = environment.agent_for(task) if environment is not None else None
    return declared or DEFAULT_AGENT


def _import_target(path: str) -> Any:
    target = AGENTS.load(path)
    if isinstance(target, type):
        if not issubclass(target, Agent):
            raise UnknownAgentError(f"'{path}' is not a subclass of rayrollout.agentkit.Agent")
    elif not inspect.iscoroutinefunction(target):
        raise UnknownAgentError(
            f"'{path}' is neither an Agent subclass nor an async function play(episode)"
        )
    return target
