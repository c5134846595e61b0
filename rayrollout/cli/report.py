"""``rayrollout report``: one self-contained HTML page describing a run's output folder.

Reads the folder once into an episode table (``data.episode_table``), computes the run's
figures (``data.run_summary``), draws the plots (``report_figures``) and lays out the page
(``report_page``): one file that opens anywhere.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

from rayrollout.cli import report_figures as plots
from rayrollout.cli.report_page import (
    LIST_LIMIT,
    SECTIONS,
    episode_list,
    errors_table,
    headline,
    page,
    per_env_table,
    run_table,
    segments_table,
)
from rayrollout.data.episode_table import load_episodes
from rayrollout.data.images import decode_data_url, is_data_url, thumbnail
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.run_summary import RunSummary, segment_labels, summarize

__all__ = ["SECTIONS", "load_run", "render_report"]

_SLOWEST = 10
_THUMBNAILS = 4  # images shown per listed episode
"""Episodes in the slowest list: the tail worth opening; ``show --sort seconds`` has the rest."""

load_run = load_episodes
"""The report's table of a folder (one row per episode, metrics as ``m_<name>``)."""


def _rejects(directory: Path) -> int:
    path = RunFolder(directory).rejects_path
    if not path.exists():
        return 0
    with path.open(encoding="utf-8") as file:
        return sum(1 for line in file if line.strip())


def _groups_text(summary: RunSummary) -> str:
    g = summary.groups
    if not g.groups:
        return (
            '<p class="note">No task has two samples or more, so there are no GRPO groups '
            "(run with <code>-n 2</code> or more to see the spread).</p>"
        )
    sizes = ", ".join(f"{n:,} of {size} samples" for size, n in sorted(g.samples_per_group.items()))
    return (
        f"<p>{g.groups:,} groups (the samples of one task: {sizes}); "
        f"<b>{g.zero_spread:,} ({g.zero_spread_share:.1%})</b> have zero reward spread, "
        "so every sample in them gets zero advantage and teaches a GRPO step nothing; "
        f"mean within-group std {g.mean_std:.3f}."
        + (f" {g.single_sample_tasks:,} tasks have one sample." if g.single_sample_tasks else "")
        + "</p>"
    )


def _versions(frame: pd.DataFrame, summary: RunSummary) -> str:
    rows = "".join(
        f"<tr><td>{version}</td><td>{count:,}</td>"
        f"<td>{frame.loc[frame['policy_version'] == version, 'reward'].mean():.3f}</td></tr>"
        for version, count in summary.policy_versions.items()
    )
    table = (
        '<table class="narrow"><tr><th>policy version</th><th>episodes</th>'
        "<th>mean reward</th></tr>"
        f"{rows}</table>"
    )
    if len(summary.policy_versions) > 1:
        return plots.versions_plot(frame) + table
    return table + (
        '<p class="note">One policy version: the weights did not change during the run.</p>'
    )


def episode_thumbnails(
    folder: RunFolder, rows: pd.DataFrame, per_episode: int = _THUMBNAILS
) -> dict[tuple[str, int], list[str]]:
    """Thumbnails (PNG data URLs) of the first distinct images each listed episode shows,
    by ``(task_id, sample_index)``; only the listed tasks' rows are read (the folder's
    filtered scan), so a run's images are never loaded whole."""
    wanted = {(str(t), int(s)) for t, s in zip(rows["task_id"], rows["sample_index"], strict=True)}
    found: dict[tuple[str, int], list[str]] = {}
    for task_id in sorted({t for t, _ in wanted}):
        for trajectory in folder.trajectories(task_id=task_id):
            key = (trajectory.task_id, trajectory.sample_index)
            if key not in wanted:
                continue
            urls: list[str] = []
            for message in trajectory.messages:
                for part in message.images:
                    if part.url and part.url not in urls:
                        urls.append(part.url)
            thumbs = []
            for url in urls[:per_episode]:
                small = thumbnail(decode_data_url(url)[1]) if is_data_url(url) else None
                if small is not None:
                    thumbs.append(small)
            found[key] = thumbs
    return found


def render_report(directory: str | Path, title: str | None = None) -> str:
    """The report page for an output folder, as one HTML string.

    Raises:
        EmptyRunError: the folder holds no parts.
        PartError: a part cannot be read.
    """
    folder = Path(directory).resolve()
    frame = load_episodes(folder)
    summary = summarize(frame)
    labels = segment_labels(frame)
    where = shlex.quote(str(folder))
    failed = frame[frame["status"] != "ok"].sort_values(
        ["environment", "status", "finished_at"], kind="stable"
    )
    slowest = frame.sort_values("m_seconds_total", ascending=False, kind="stable")
    thumbnails = episode_thumbnails(
        RunFolder(folder), pd.concat([failed.head(LIST_LIMIT), slowest.head(_SLOWEST)])
    )
    sections = {
        "run": run_table(folder, summary, _rejects(folder)),
        "summary": per_env_table(frame),
        "throughput": plots.throughput_plot(frame, labels, summary) + segments_table(summary),
        "rewards": plots.rewards_plot(frame),
        "groups": _groups_text(summary) + plots.groups_plot(frame),
        "lengths": plots.lengths_plot(frame),
        "time": plots.time_plot(frame),
        "versions": _versions(frame, summary),
        "status": plots.statuses_plot(frame) + errors_table(frame),
        "failed": episode_list(
            folder,
            failed.head(LIST_LIMIT),
            len(failed),
            f"rayrollout show {where} --status failed --limit 0",
            "failed",
            thumbnails,
        ),
        "slowest": episode_list(
            folder,
            slowest.head(_SLOWEST),
            len(slowest),
            f"rayrollout show {where} --sort seconds --limit 0",
            "",
            thumbnails,
        ),
    }
    return page(title or f"rayrollout report: {folder.name}", headline(summary), sections)
