"""Why a run's episodes failed, for the closing summary: the commonest reasons with their
counts and a ``rayrollout show`` command for one example each; and the exit code of a run
in which every episode failed.

Read from this run's parts only, and only when episodes failed.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from rayrollout.data.run_folder import RunFolder
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import EnvStats

__all__ = [
    "ALL_FAILED_EXIT",
    "FAILED_STATUSES",
    "Reason",
    "all_failed",
    "failed_count",
    "reason_key",
    "reason_of",
    "report_failures",
    "show_command",
    "top_reasons",
]

ALL_FAILED_EXIT = 3
"""Exit code of ``collect`` (and ``demo``) when every episode failed: the rows are written,
but a script that goes on to train on them should stop. 1 and 2 stay the codes of a run that
could not run (``error: ...``), 130 that of an interrupted one."""

FAILED_STATUSES = ("error", "timeout")
"""Statuses of episodes that failed: nothing scored them. ``max_turns`` and ``truncated``
are outcomes of the model, verified and scored like ``ok``."""

_MAX_REASON = 160  # characters of a reason shown; the example's row has the whole error
# An exception's type name followed by its message: ``RuntimeError: boom on 'x'``.
_TYPE = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception|Exit|Timeout|Lost)(?=:)")
# The values a message names, which differ per task: quoted text, numbers, hex ids.
_VALUES = re.compile(r"'[^']*'|\"[^\"]*\"|\b0x[0-9a-fA-F]+\b|\b[0-9a-f]{8,}\b|\b\d+(?:\.\d+)?")
_NUMBERS = re.compile(r"\b\d+(?:\.\d+)?")


def failed_count(stats: EnvStats) -> int:
    """Episodes of ``stats`` that failed (``FAILED_STATUSES``)."""
    return sum(stats.statuses.get(status, 0) for status in FAILED_STATUSES)


def all_failed(stats: EnvStats) -> bool:
    """Whether the run had episodes and every one of them failed."""
    return stats.episodes > 0 and failed_count(stats) == stats.episodes


def reason_of(error: str | None) -> str:
    """An error's reason as the summary shows it: its first line, cause included
    (``setting up the environment failed: ResetStepError: GEM environment id 'x' is not
    registered; ...``), cut to 160 characters (the example's row has the whole error)."""
    lines = (error or "").strip().splitlines()
    first = lines[0].strip() if lines else ""
    if not first:
        return "(no error message)"
    return first if len(first) <= _MAX_REASON else first[: _MAX_REASON - 3] + "..."


def reason_key(reason: str) -> str:
    """What episodes that failed the same way share: the ``reason`` with the values its
    message names masked (quoted text, numbers, hex ids), since they usually differ per task
    (``tool 'run' failed: RuntimeError: boom on 'task 7'``). Up to the exception's type only
    numbers are: a different tool is a different reason, another step of the same failure
    is not (``failed in step 2``)."""
    match = _TYPE.search(reason)
    head, message = (reason[: match.end()], reason[match.end() :]) if match else ("", reason)
    return _NUMBERS.sub("<n>", head) + _VALUES.sub("<value>", message)


@dataclass(frozen=True)
class Reason:
    """One reason episodes failed: the first such episode's reason (``reason_of``), how many
    failed alike (``reason_key``), and that episode, to look at."""

    text: str
    task_id: str
    sample_index: int
    count: int


def top_reasons(
    out_dir: str | Path, parts: Iterable[str | Path], top: int = 3
) -> tuple[list[Reason], int]:
    """The ``top`` commonest reasons among the failed rows of ``parts``, commonest first,
    and how many failed rows the others account for."""
    columns = ["task_id", "sample_index", "status", "error"]
    table = RunFolder(out_dir).table(columns, parts=[Path(p) for p in parts])
    counts: Counter[str] = Counter()
    example: dict[str, tuple[str, str, int]] = {}  # by key: the first such row's reason
    for task_id, index, status, error in zip(
        *(table.column(name).to_pylist() for name in columns), strict=True
    ):
        if status not in FAILED_STATUSES:
            continue
        text = reason_of(error)
        key = reason_key(text)
        counts[key] += 1
        example.setdefault(key, (text, task_id, index))
    shown = [Reason(*example[key], count=n) for key, n in counts.most_common(top)]
    return shown, sum(counts.values()) - sum(r.count for r in shown)


def show_command(out_dir: str | Path, reason: Reason) -> str:
    """The ``rayrollout show`` command line that prints ``reason``'s example episode."""
    return " ".join(
        [
            "rayrollout show",
            shlex.quote(str(out_dir)),
            *("--task-id", shlex.quote(reason.task_id)),
            *("--sample", str(reason.sample_index)),
        ]
    )


def report_failures(console: Console, summary: RunSnapshot, top: int = 3) -> None:
    """Print why episodes failed (if any did), and end the command with ``ALL_FAILED_EXIT``
    when every episode failed.

    The reasons are read from the parts this run wrote (``summary.parts``), which also name
    the folder, so an engine attached with another output folder is reported right. Each
    example's command is printed unwrapped, to copy whole (as the output path above it).
    """
    stats = summary.total
    failed = failed_count(stats)
    parts = [Path(p) for p in summary.parts]
    if failed and parts:
        out_dir = parts[0].parent
        reasons, others = top_reasons(out_dir, parts, top)
        by_status = ", ".join(
            f"{status} {stats.statuses[status]}"
            for status in FAILED_STATUSES
            if stats.statuses.get(status)
        )
        console.print(
            f"[bold red]failed:[/bold red] {failed} of {stats.episodes} episodes ({by_status})"
            f"; the commonest reasons:",
            highlight=False,
        )
        for reason in reasons:
            console.print(Text(f"{reason.count:>6}  {reason.text}"), highlight=False)
            console.print(
                Text(f"        e.g. {show_command(out_dir, reason)}", style="dim"),
                highlight=False,
                soft_wrap=True,
            )
        if others:
            console.print(f"{others:>6}  for other reasons", highlight=False)
    if all_failed(stats):
        console.print(
            f"[bold red]every episode failed[/bold red]: exit code {ALL_FAILED_EXIT}",
            highlight=False,
        )
        raise typer.Exit(ALL_FAILED_EXIT)
