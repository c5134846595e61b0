"""The data layer's exceptions (config, task rows and shards, images, the output folder,
export): one module, so "what can reading or writing a run raise" has one answer.
"""

from __future__ import annotations

from typing import Any

from rayrollout.errors import InputError, OutputError

__all__ = [
    "ConfigError",
    "EmptyRunError",
    "ExportError",
    "HeadReadError",
    "ImageError",
    "InvalidTaskError",
    "LateImages",
    "PartError",
    "RowRefused",
    "ShardReadError",
    "WriterError",
]


class ConfigError(InputError, ValueError):
    """A config file or flag that does not validate, with the offending key."""


class EmptyRunError(OutputError, FileNotFoundError):
    """The folder holds no part files: not a run's output folder, or a run that wrote nothing."""


class ExportError(InputError, ValueError):
    """The input cannot be exported: a missing folder, no rows, a bad row, a bad option."""


class LateImages(ExportError):  # noqa: N818 (a signal ``export_run`` handles, not a fault)
    """A row with images came after rows were written without the ``images`` column."""


class ImageError(InputError, ValueError):
    """An image that cannot be read: a malformed data URL, a missing file, bytes of no
    image format known here."""


class WriterError(OutputError, RuntimeError):
    """Output could not be written (disk full, permissions, a bad folder, a held lock)."""


class PartError(OutputError, ValueError):
    """A part file could not be read; the message names the file and the line or row."""


class HeadReadError(InputError):
    """A shard the child process could not read: ``index`` in the paths asked (None: the
    process itself failed), and why. An input error: the task set is what is wrong."""

    def __init__(self, index: int | None, message: str) -> None:
        super().__init__(message)
        self.index = index


class ShardReadError(InputError, OSError):
    """A shard of a task set could not be read (not Parquet, unreadable, gone)."""


class InvalidTaskError(InputError, ValueError):
    """A task row that cannot run, with where it is and what is wrong."""

    def __init__(self, source: str, line: int, field: str | None, message: str) -> None:
        self.source, self.line, self.field, self.message = source, line, field, message
        where = f"{source} line {line}" + (f", field '{field}'" if field else "")
        super().__init__(f"{where}: {message}")

    def to_record(self, raw: str | None = None) -> dict[str, Any]:
        """The reject-file row for this error."""
        return {
            "source": self.source,
            "line": self.line,
            "field": self.field,
            "error": self.message,
            "raw": raw,
        }


class RowRefused(InputError):
    """Raised by a ``check_environment`` callable of ``check_rows``: the row's environment is
    known but refused (``str(exc)`` says why); the row becomes an ``InvalidTaskError`` of
    field 'environment' naming its line (``claim_row``)."""
