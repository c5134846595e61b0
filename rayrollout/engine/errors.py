"""The engine's exceptions (the local Ray head, the policy endpoint, a weights path): one
module, so "what can starting or updating the engine raise" has one answer.
"""

from __future__ import annotations

from rayrollout.errors import ClusterError, InputError

__all__ = [
    "LocalHeadError",
    "PolicyEndpointError",
    "WeightsPathError",
]


class LocalHeadError(ClusterError, RuntimeError):
    """The local Ray head could not be started (its log says why)."""


class WeightsPathError(InputError, ValueError):
    """A checkpoint path ``update_weights`` refuses: the policy was not paused or touched."""


class PolicyEndpointError(InputError, ValueError):
    """The config names no usable policy endpoint."""
