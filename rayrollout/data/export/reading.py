"""Reading a run's output folder for an export: rows part by part, and the first pass over
a task's samples that DPO pairs and verl rows need.

Rows come from ``RunFolder`` batch by batch, without the ``turns`` column (most of a row's
bytes, which no export needs); a bad row is an ``ExportError`` naming file, line and field.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rayrollout.data.export.base import ExportError, ExportSummary
from rayrollout.data.run_folder import PartError, RunFolder
from rayrollout.data.schema import Trajectory
from rayrollout.data.validation import first_problem

__all__ = ["Group", "groups", "number", "open_folder", "part_files", "rows", "trajectory"]

_SKIPPED_COLUMNS = frozenset({"turns"})
_KEY_COLUMNS = frozenset({"task_id", "sample_index", "reward", "status"})


def open_folder(directory: str | Path) -> RunFolder:
    """The run folder to export, refused when it is missing, a file, or holds no parts."""
    folder = RunFolder(directory)
    if not folder.path.exists():
        raise ExportError(f"input folder not found: {folder.path}")
    if not folder.path.is_dir():
        raise ExportError(
            f"{folder.path} is a file; IN is the output folder of `rayrollout collect`"
        )
    if not folder.parts():
        raise ExportError(
            f"no part files (part-*.parquet or part-*.jsonl) in {folder.path}: is it the "
            "output folder of `rayrollout collect`?"
        )
    return folder


def part_files(directory: str | Path) -> list[Path]:
    """The part files of a run's output folder, Parquet first, each kind in name order."""
    return open_folder(directory).parts()


def rows(
    folder: RunFolder, columns: frozenset[str] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) for every row; ``columns`` limits what is read, else all but ``turns``."""
    try:
        if columns is None:
            yield from folder.rows(exclude=_SKIPPED_COLUMNS)
        else:
            yield from folder.rows(columns)
    except PartError as exc:
        raise ExportError(str(exc)) from None


def trajectory(where: str, row: dict[str, Any]) -> Trajectory:
    """The row as a trajectory, or an error naming the row and the first bad field."""
    try:
        return Trajectory.from_row(row)
    except ValidationError as exc:
        name, problem, _ = first_problem(exc)
        raise ExportError(f"{where}, field '{name or '?'}': {problem}") from None
    except ValueError as exc:  # a JSON column whose text is not JSON
        raise ExportError(f"{where}: a JSON column is not valid JSON ({exc})") from None


def number(where: str, row: dict[str, Any], name: str) -> float:
    """A numeric field of a row, or an error naming the row, the field and its value."""
    if row.get(name) is None:
        raise ExportError(f"{where}, field '{name}': missing")
    try:
        return float(row[name])
    except (TypeError, ValueError):
        raise ExportError(f"{where}, field '{name}': not a number: {row[name]!r}") from None


@dataclass
class Group:
    """What the first pass keeps of one task: counts, and its best and worst 'ok' samples."""

    samples: int = 0
    reward_sum: float = 0.0
    best: tuple[float, int] | None = None  # (reward, sample_index)
    worst: tuple[float, int] | None = None


def groups(folder: RunFolder, counts: ExportSummary) -> dict[str, Group]:
    """The first pass: reads only ``task_id``, ``sample_index``, ``reward`` and ``status``
    and keeps a few numbers per task."""
    found: dict[str, Group] = {}
    for where, row in rows(folder, _KEY_COLUMNS):
        counts.rows_read += 1
        if row.get("task_id") is None:
            raise ExportError(f"{where}, field 'task_id': missing")
        task_id = str(row["task_id"])
        reward, index = number(where, row, "reward"), int(number(where, row, "sample_index"))
        group = found.setdefault(task_id, Group())
        group.samples += 1
        group.reward_sum += reward
        if row.get("status") != "ok":
            continue
        # Ties go to the lowest sample index, so the same folder always gives the same pairs.
        if group.best is None or (reward, -index) > (group.best[0], -group.best[1]):
            group.best = (reward, index)
        if group.worst is None or (reward, index) < group.worst:
            group.worst = (reward, index)
    counts.tasks = len(found)
    return found
