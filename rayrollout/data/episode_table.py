"""A run's episodes as one flat table: a row per episode, the columns a summary reads.

``rayrollout report`` and ``show`` read a run through it, so they agree on an episode's
times and tokens; only the small columns are read, so a large run stays cheap. Each row has
``queued_at``, ``started_at``, ``finished_at`` (Unix seconds) and ``run``, its part's run id.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pandas as pd
import pyarrow as pa

from rayrollout.data.errors import EmptyRunError
from rayrollout.data.run_folder import RunFolder

__all__ = ["EPISODE_COLUMNS", "METRIC_COLUMNS", "EmptyRunError", "load_episodes"]

EPISODE_COLUMNS = [
    "task_id",
    "sample_index",
    "environment",
    "model",
    "policy_version",
    "reward",
    "status",
    "error",
    "close_error",
    "metrics",
    "created_at",
]
"""The row columns read; ``messages``, ``turns`` and ``tools`` (the bulky ones) never are."""

METRIC_COLUMNS = [
    "started_at",
    "turns",
    "tool_calls",
    "tool_errors",
    "tokens_in",
    "tokens_out",
    "turns_across_updates",
    "seconds_model",
    "seconds_tools",
    "seconds_verify",
    "seconds_total",
    "seconds_queued",
]
"""The per-episode metrics kept, as ``m_<name>`` columns (the timeline and tool names are
dropped: lists, and no summary needs them)."""


def load_episodes(directory: str | Path) -> pd.DataFrame:
    """Every episode of an output folder (both formats, every run in it), one row each.

    Columns: ``EPISODE_COLUMNS`` but ``metrics`` and ``created_at``, ``m_<metric>`` for each
    of ``METRIC_COLUMNS``, and ``run``, ``queued_at``, ``started_at``, ``finished_at``
    (Unix seconds; see the module docstring). Rows are in the order their parts were written.

    Raises:
        EmptyRunError: the folder does not exist or holds no ``part-*`` files.
        PartError: a part cannot be read (the message names it).
    """
    folder = RunFolder(directory)
    parts = folder.parts()
    if not parts:
        where = folder.path if folder.path.is_dir() else f"{folder.path} (no such folder)"
        raise EmptyRunError(
            f"no part files (part-*.parquet or part-*.jsonl) in {where}; give the --out "
            "folder of a `rayrollout collect` that wrote at least one episode"
        )
    by_run: dict[str, list[Path]] = defaultdict(list)
    for part in parts:
        by_run[RunFolder.run_of(part)].append(part)
    frames = []
    for run, run_parts in by_run.items():
        frame = _flat(folder.table(EPISODE_COLUMNS, parts=run_parts))
        frame.insert(0, "run", run)
        frames.append(frame)
    return _with_times(pd.concat(frames, ignore_index=True))


def _flat(table: pa.Table) -> pd.DataFrame:
    """The table with ``metrics`` spread into ``m_<name>`` columns."""
    metrics = table.column("metrics").combine_chunks()
    names = [metrics.type.field(i).name for i in range(metrics.type.num_fields)]
    table = table.drop_columns(["metrics"])
    for name in METRIC_COLUMNS:
        if name in names:
            column = metrics.field(names.index(name))
        else:  # a metric rows written before it existed lack: 0 there
            column = pa.array([0] * len(table), pa.int64())
        table = table.append_column(f"m_{name}", column)
    return table.to_pandas()


def _with_times(frame: pd.DataFrame) -> pd.DataFrame:
    """Add ``queued_at``, ``started_at`` and ``finished_at`` as Unix seconds (see the module
    docstring); ``created_at`` and ``m_started_at`` are folded into them."""
    created = frame.pop("created_at")
    created_s = (created - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    started = frame.pop("m_started_at")
    frame["started_at"] = started.where(started > 0, created_s)
    frame["finished_at"] = frame["started_at"] + frame["m_seconds_total"].clip(lower=0)
    frame["queued_at"] = frame["started_at"] - frame["m_seconds_queued"].clip(lower=0)
    return frame
