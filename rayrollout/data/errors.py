"""The data layer's exceptions (config, tasks' shards, images, the output folder, export):
one module, so "what can reading or writing a run raise" has one answer.
"""

from __future__ import annotations

from rayrollout.errors import InputError, OutputError

__all__ = [
    "ConfigError",
    "EmptyRunError",
    "ExportError",
    "HeadReadError",
    "ImageError",
    "LateImages",
    "PartError",
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
