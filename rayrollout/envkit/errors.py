"""The environment side's exceptions (registry, sessions, tools, NeMo Gym, reset-step,
OpenEnv): one module, so "what can hosting an environment raise" has one answer.
"""

from __future__ import annotations

from rayrollout.errors import EnvironmentBoundaryError, InputError

__all__ = [
    "ActionRejected",
    "DuplicateEnvironmentError",
    "EnvironmentArgsError",
    "EnvironmentLost",
    "EnvironmentRoutingError",
    "EnvironmentSetupFailed",
    "NemoGymError",
    "OpenEnvError",
    "ResetStepError",
    "SessionNotOpen",
    "ToolCallRejected",
    "ToolError",
    "UnknownEnvironmentError",
]


class ToolError(EnvironmentBoundaryError):
    """A tool problem the model is told about (the episode goes on)."""


class NemoGymError(EnvironmentBoundaryError, RuntimeError):
    """A resources server failed (after retries) or answered outside the protocol."""


class EnvironmentRoutingError(EnvironmentBoundaryError, RuntimeError):
    """A forwarded call of an HTTP session found no replica (Ray's router dropped it)."""


class ResetStepError(EnvironmentBoundaryError, RuntimeError):
    """A reset/step environment failed (could not be made, reset or stepped, or gave a
    reward that is not a finite number); the message names the source and its id."""


class OpenEnvError(ResetStepError):
    """An OpenEnv environment failed, its server refused the session, or the session was
    lost mid-episode; the message names the environment and what failed."""


class ActionRejected(EnvironmentBoundaryError, ValueError):
    """The action did not fit the environment's action class: its validation errors, for
    the model to read (as ``ToolError`` is). Not an environment failure: nothing was
    stepped, and the episode goes on."""


class UnknownEnvironmentError(InputError, LookupError):
    """A task or config named an environment that nothing registers."""


class DuplicateEnvironmentError(UnknownEnvironmentError):
    """One name registered for two different classes (entry points, or config and registry).

    A ``LookupError`` like an unknown name: the name cannot be resolved to one class.
    """


class EnvironmentArgsError(InputError, TypeError):
    """The config's ``args`` do not fit the environment class's constructor."""


class SessionNotOpen(EnvironmentBoundaryError, LookupError):
    """A replica holds no state for the episode: it was closed, expired, or the replica
    restarted."""


class EnvironmentLost(EnvironmentBoundaryError, RuntimeError):
    """The episode's replica died or restarted mid-episode; its state is gone (retry it)."""


class EnvironmentSetupFailed(EnvironmentBoundaryError, RuntimeError):
    """The environment's ``setup`` raised on its replica (opening a stateful session)."""


class ToolCallRejected(EnvironmentBoundaryError):
    """A tool call the model got wrong; the message is what the model reads, as an error
    result (the episode goes on)."""
