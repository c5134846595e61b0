"""The API's exceptions (the checks before a run and its rows; the engine and service missing,
taken or gone; the service's batches and journals): one module, so "what can driving a run
raise" has one answer.
"""

from __future__ import annotations

from rayrollout.data.errors import ConfigError, InvalidTaskError
from rayrollout.data.run_folder import REJECTS_FILE
from rayrollout.errors import ClusterError, InputError

MAX_ERRORS_SHOWN = 50
"""Rows an ``InvalidTasksError`` message lists; the rest are counted."""

__all__ = [
    "CursorGoneError",
    "EngineDiedError",
    "EngineExistsError",
    "EnvironmentCheckError",
    "EnvironmentUnavailableError",
    "EnvironmentUrlError",
    "InvalidTasksError",
    "NotUpError",
    "OpenJournalsError",
    "OutputFolderError",
    "OutputNotEmptyError",
    "PolicyCheckError",
    "PreflightError",
    "TasksFileError",
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


class OutputNotEmptyError(InputError, FileExistsError):
    """A new run met an earlier run's parts in its output folder (without resume/overwrite)."""


class InvalidTasksError(InputError, ValueError):
    """Rows that cannot run; the message lists them (up to 50).

    Found before anything ran (the head's rows), or, with ``stopped``, the one row past the
    head that ended a run: the rows before it were run and written, and ``--resume``
    finishes the run once it is fixed.
    """

    def __init__(
        self,
        source: str,
        errors: list[InvalidTaskError],
        hint: str = "",
        stopped: bool = False,
        total: int | None = None,
    ) -> None:
        self.source, self.errors, self.stopped = source, errors, stopped
        total = len(errors) if total is None else total
        shown = "\n".join(f"  {exc}" for exc in errors[:MAX_ERRORS_SHOWN])
        more = total - min(len(errors), MAX_ERRORS_SHOWN)
        if stopped:
            what = (
                f"invalid row in {source}; the run stopped at it (the episodes of the rows "
                "before it ran and are written). Fix it, or pass --skip-invalid "
                f"(skip_invalid=True in Python) to write bad rows to {REJECTS_FILE} and go "
                "on; then run the same command with --resume to finish the run:"
            )
        else:
            what = (
                f"{total} invalid row(s) in {source}; nothing was run. Fix them, or pass "
                f"--skip-invalid (skip_invalid=True in Python) to run the valid rows and write "
                f"the rest to {REJECTS_FILE} in the output folder:"
            )
        super().__init__(
            f"{what}\n{shown}"
            + (f"\n  ... and {more} more" if more > 0 else "")
            + (f"\n  {hint}" if hint else "")
        )


class PreflightError(InputError, ValueError):
    """A check before start failed; nothing was started. The message names the fix."""


class TasksFileError(PreflightError, ConfigError):
    """The tasks path is missing, a directory, or unreadable (a ``ConfigError`` too)."""


class EnvironmentUnavailableError(PreflightError):
    """An environment the tasks name needs something this machine lacks (a system package,
    privileges); the message is the environment's own line naming the fix."""


class EnvironmentCheckError(PreflightError):
    """An environment the rows name cannot be played as configured: its args name what its
    source lacks (a class that does not import, a URL that does not answer), or rows name an
    id it does not register; the message is the environment's own line naming the fix."""


class OutputFolderError(PreflightError):
    """The output folder is a file, or cannot be created or written."""


class EnvironmentUrlError(PreflightError):
    """An environment served by URL (``--env-url``) that does not answer."""


class PolicyCheckError(PreflightError):
    """An external policy without a base URL or key, unreachable, refusing the key, or not
    serving the model."""
