"""The engine's exceptions (the local Ray head, a weights path): one module, so "what can
starting or updating the engine raise" has one answer.
"""

from __future__ import annotations

from rayrollout.errors import ClusterError, InputError

__all__ = ["LocalHeadError", "WeightsPathError"]


class LocalHeadError(ClusterError, RuntimeError):
    """The local Ray head could not be started (its log says why)."""


class WeightsPathError(InputError, ValueError):
    """A checkpoint path ``update_weights`` refuses: the policy was not paused or touched."""
