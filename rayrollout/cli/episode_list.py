"""``rayrollout show RUN`` without ``--task-id``: the run's episodes, one line each.

The way into a run from the terminal: filter by status, reward or environment, sort by
task, time or reward, and copy a task id and sample index into ``show --task-id``. Lines are
plain padded text, not a table that wraps or cuts, so ids stay whole and ``grep`` works.
The episodes come from the same table the report reads (``data.episode_table``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

import pandas as pd

from rayrollout.cli.errors import EpisodeFilterError
from rayrollout.data.schema import Status

__all__ = [
    "FAILED",
    "SORTS",
    "EpisodeFilterError",
    "filter_episodes",
    "format_lines",
    "sort_episodes",
]

FAILED = "failed"
"""The ``--status`` value that stands for every status but ``ok``."""
SORTS = {
    "task": (["task_id", "sample_index"], [True, True]),
    "seconds": (["m_seconds_total", "task_id", "sample_index"], [False, True, True]),
    "reward": (["reward", "task_id", "sample_index"], [True, True, True]),
}
"""``--sort`` choices: by task (default), slowest first, lowest reward first."""


def filter_episodes(
    frame: pd.DataFrame,
    statuses: Sequence[str] = (),
    envs: Sequence[str] = (),
    min_reward: float | None = None,
    max_reward: float | None = None,
) -> pd.DataFrame:
    """The episodes matching every filter given (a list filter matches any of its values).

    Raises:
        EpisodeFilterError: a status that no episode can have, or min above max reward.
    """
    known = set(get_args(Status)) | {FAILED}
    unknown = sorted(set(statuses) - known)
    if unknown:
        raise EpisodeFilterError(
            f"--status {', '.join(unknown)}: no such status; use one of "
            f"{', '.join(sorted(known))} ({FAILED!r}: every status but ok)"
        )
    if min_reward is not None and max_reward is not None and min_reward > max_reward:
        raise EpisodeFilterError(
            f"--min-reward {min_reward} is above --max-reward {max_reward}: nothing can match"
        )
    keep = pd.Series(True, index=frame.index)
    if statuses:
        wanted = frame["status"].isin(statuses)
        if FAILED in statuses:
            wanted |= frame["status"] != "ok"
        keep &= wanted
    if envs:
        keep &= frame["environment"].isin(envs)
    if min_reward is not None:
        keep &= frame["reward"] >= min_reward
    if max_reward is not None:
        keep &= frame["reward"] <= max_reward
    return frame[keep]


def sort_episodes(frame: pd.DataFrame, by: str) -> pd.DataFrame:
    """``frame`` in the order of a ``SORTS`` key (refused by name if unknown)."""
    if by not in SORTS:
        raise EpisodeFilterError(f"--sort {by}: use one of {', '.join(SORTS)}")
    columns, ascending = SORTS[by]
    return frame.sort_values(columns, ascending=ascending, kind="stable")


_HEAD = ("task id", "sample", "environment", "status", "reward", "turns", "seconds")


def format_lines(shown: pd.DataFrame, matched: int, total: int, directory: Path) -> list[str]:
    """The header, one line per episode of ``shown``, and what was left out and how to open one.

    ``matched`` is how many episodes passed the filters and ``total`` how many the run has.
    """
    cells = [
        (
            str(row.task_id),
            str(int(row.sample_index)),
            str(row.environment),
            str(row.status),
            f"{float(row.reward):.3f}",
            str(int(row.m_turns)),
            f"{float(row.m_seconds_total):.2f}",
        )
        for row in shown.itertuples(index=False)
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(_HEAD)]
    right = {1, 4, 5, 6}  # numbers line up on the right

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if i in right else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    lines = [line(_HEAD)] + [line(c) for c in cells]
    filtered = "" if matched == total else f" (of {total:,} in the run)"
    if matched > len(shown):
        lines.append(
            f"{len(shown):,} of {matched:,} matching episodes shown{filtered}; "
            f"{matched - len(shown):,} more: --limit {matched} (or 0) shows them all"
        )
    else:
        lines.append(f"{matched:,} matching episodes{filtered}")
    if cells:
        first = cells[0]
        lines.append(
            f"open one: rayrollout show {shlex.quote(str(directory))} "
            f"--task-id {shlex.quote(first[0])} --sample {first[1]}"
        )
    return lines
