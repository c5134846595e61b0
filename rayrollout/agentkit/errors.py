"""The agent side's exceptions (registry, the OpenAI gateway): one module, so "what can
playing an episode's loop raise" has one answer.
"""

from __future__ import annotations

from rayrollout.errors import ClusterError, InputError

__all__ = ["AgentArgsError", "BadRequest", "FrontPortTaken", "UnknownAgentError"]


class FrontPortTaken(ClusterError, RuntimeError):
    """The front's port is held by a program that is not rayrollout's gateway front (a
    service the run needs is taken, as for a named actor another run holds)."""


class BadRequest(InputError, ValueError):
    """A request field the gateway cannot read; ``param`` names it."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param}: {problem}")
        self.param = param


class UnknownAgentError(InputError, LookupError):
    """A task, flag or config named an agent that nothing registers (or two things do)."""


class AgentArgsError(InputError, TypeError):
    """The config's ``args`` do not fit the agent's constructor (or function)."""
