"""The API's exceptions (the engine and service missing, taken or gone; the service's
batches and journals): one module, so "what can driving a run raise" has one answer.
"""

from __future__ import annotations

from rayrollout.errors import ClusterError, InputError

__all__ = [
    "CursorGoneError",
    "EngineDiedError",
    "EngineExistsError",
    "NotUpError",
    "OpenJournalsError",
]


class NotUpError(ClusterError, LookupError):
    """A named actor or app of the run (the engine, a Serve app) is not up in the namespace."""


class EngineExistsError(ClusterError, RuntimeError):
    """Another run's engine holds the name in this namespace."""


class EngineDiedError(ClusterError, RuntimeError):
    """The engine actor died mid-run; what it wrote stays, and ``--resume`` finishes the run."""


class CursorGoneError(InputError, LookupError):
    """A stream asked for rows below what the client already acknowledged (freed)."""


class OpenJournalsError(InputError, FileExistsError):
    """``rayrollout up`` without ``--resume`` over a folder holding unfinished batches."""
