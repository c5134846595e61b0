"""The trainer adapters' exceptions (a batch with too many failed or dropped episodes): one
module for every adapter.
"""

from __future__ import annotations

from rayrollout.errors import EpisodesFailedError

__all__ = ["TooManyDroppedError", "TooManyFailuresError"]


class TooManyFailuresError(EpisodesFailedError, RuntimeError):
    """More of a batch's episodes failed than the adapter was told to accept."""


class TooManyDroppedError(EpisodesFailedError):
    """More of a batch was failed or stale than the rollout was told to accept."""
