"""The policy side's exceptions (the model server's calls, HTTP, templates, the gate, kinds and
weight updates): one module, so "what can a model call raise" has one answer.
"""

from __future__ import annotations

from rayrollout.errors import InputError, PolicyBoundaryError

__all__ = [
    "HttpStatusError",
    "HttpTimeout",
    "HttpTransportError",
    "PolicyError",
    "PolicyTimeout",
    "StaleEpisode",
    "TemplateError",
    "UnknownPolicyKindError",
    "WeightUpdateError",
]


class PolicyError(PolicyBoundaryError, RuntimeError):
    """The policy server failed (after retries) or answered something unusable."""


class PolicyTimeout(PolicyError):
    """The policy server did not answer in time (after retries)."""


class StaleEpisode(PolicyError):
    """The policy moved on more than ``max_staleness`` versions during the episode."""


class HttpStatusError(PolicyBoundaryError):
    """The server answered an HTTP error status (after retries, where retried)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class HttpTimeout(PolicyBoundaryError):
    """No answer within the timeout, on every try."""


class HttpTransportError(PolicyBoundaryError):
    """The connection failed on every try (refused, reset, DNS)."""


class TemplateError(PolicyBoundaryError, ValueError):
    """The chat template cannot give exact token deltas (it is not append-only)."""


class WeightUpdateError(PolicyBoundaryError, RuntimeError):
    """The policy backend could not pause, resume or load weights."""


class UnknownPolicyKindError(InputError, LookupError):
    """A config named a policy kind nothing registers, or one name has two targets."""
