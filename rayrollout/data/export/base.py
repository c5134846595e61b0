"""What every export shares: the kinds there are, the error they raise and the summary
their row sources fill in as they read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rayrollout.data.errors import ExportError

__all__ = ["KINDS", "ExportError", "ExportSummary"]

KINDS = ("sft", "dpo", "nemo-gym", "verl")


@dataclass
class ExportSummary:
    """What an export read and wrote (the row sources count into it as they go).

    ``rows_written`` counts ``out``'s rows; ``nemo-gym`` also writes the files in ``files``
    beside it, and ``failures_written`` counts the failed episodes in its failures file.
    """

    kind: str
    out: Path
    rows_read: int = 0
    rows_written: int = 0
    tasks: int = 0
    failures_written: int = 0
    files: list[Path] = field(default_factory=list)
