"""The report's plots: matplotlib figures of an episode table, each as an embedded PNG.

Drawn with the object API (no ``pyplot``), so no global state is touched. Colours carry
meaning and are fixed: a status, and an environment, has the same colour in every plot.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from rayrollout.data.run_summary import PASS_REWARD, RunSummary, group_stds, zero_spread

__all__ = [
    "STATUS_COLOURS",
    "status_colour",
    "groups_plot",
    "lengths_plot",
    "reward_range",
    "rewards_plot",
    "statuses_plot",
    "throughput_plot",
    "time_plot",
    "versions_plot",
]

WIDTH, ROW_HEIGHT, DPI = 13.0, 3.4, 100
STATUS_COLOURS = {
    "ok": "#2e7d32",  # green
    "error": "#c62828",  # red
    "timeout": "#ef6c00",  # orange
    "max_turns": "#6a1b9a",  # purple
    "truncated": "#0277bd",  # blue
}
OTHER_STATUS_COLOUR = "#757575"  # grey: a status this version does not know
_ENV_PALETTE = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def status_colour(status: str) -> str:
    """The fixed colour of a status (grey for one this version does not know)."""
    return STATUS_COLOURS.get(status, OTHER_STATUS_COLOUR)


def _env_colours(envs: Sequence[str]) -> list[str]:
    return [_ENV_PALETTE[i % len(_ENV_PALETTE)] for i in range(len(envs))]


def _img(figure: Figure, alt: str) -> str:
    """The figure as an ``<img>`` with a PNG data URI: the page stays one file."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img class="plot" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _figure(rows: int = 1, cols: int = 1, height: float = ROW_HEIGHT) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(WIDTH, height * rows), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, [ax for row in axes for ax in row]


def _by_env(frame: pd.DataFrame, column: str) -> tuple[list[str], list[np.ndarray]]:
    envs = sorted(frame["environment"].unique())
    values = [frame.loc[frame["environment"] == e, column].to_numpy(dtype=float) for e in envs]
    return envs, values


def _bins(values: Sequence[np.ndarray], integer: bool) -> list[float] | int:
    """Bin edges: one per integer for small counts (turns), else 30 equal bins."""
    present = [v for v in values if len(v)]
    if not present:
        return 10
    joined = np.concatenate(present)
    low, high = float(np.min(joined)), float(np.max(joined))
    if integer and high - low <= 40:
        return (np.arange(np.floor(low), np.floor(high) + 2) - 0.5).tolist()
    if high == low:
        return [low - 0.5, high + 0.5]
    return np.linspace(low, high, 31).tolist()


def _env_hist(ax: Axes, frame: pd.DataFrame, column: str, xlabel: str, integer: bool) -> None:
    envs, values = _by_env(frame, column)
    bins, colours = _bins(values, integer), _env_colours(envs)
    if integer:  # side-by-side bars, one group per count
        ax.hist(values, bins=bins, label=envs, color=colours)
    else:  # outlines, so environments overlap without hiding each other
        ax.hist(values, bins=bins, label=envs, color=colours, histtype="step", linewidth=1.6)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("episodes")
    ax.legend(fontsize="small")


def throughput_plot(frame: pd.DataFrame, labels: pd.Series, summary: RunSummary) -> str:
    """Episodes finished per second and episodes running/waiting, over active time.

    Gaps between segments are cut out of the time axis and drawn as a dashed line with the
    gap's length, so a resumed run shows its collect calls side by side and no line crosses
    a gap; each segment is binned on its own (about 80 bins over the whole active time).
    """
    figure = Figure(figsize=(WIDTH, 5.6), layout="constrained")
    rate_ax, load_ax = figure.subplots(2, 1, sharex=True)
    # About 80 bins over the run, but wide enough that a bin holds ~5 episodes on average:
    # narrower bins of a short run read as spikes of 0 and 1/width.
    target_bin = max(summary.active_s / 80, 5 * summary.active_s / max(summary.episodes, 1), 1e-3)
    offset = 0.0
    for number, segment in enumerate(summary.segments):
        rows = frame[labels == number]
        span = max(segment.seconds, 1e-3)
        bins = max(1, round(span / target_bin))
        edges = np.linspace(segment.start, segment.start + span, bins + 1)
        counts, _ = np.histogram(rows["finished_at"], bins=edges)
        rate = counts / (span / bins)
        x = edges - segment.start + offset
        label = "finished/s" if number == 0 else None
        rate_ax.stairs(rate, x, color="#1f77b4", linewidth=1.6, label=label)
        rate_ax.hlines(
            segment.episodes_per_s,
            offset,
            offset + span,
            color="#1f77b4",
            linestyle="--",
            linewidth=1,
            label="mean of the segment" if number == 0 else None,
        )
        times = np.linspace(segment.start, segment.start + span, 200)
        running = _active(rows["started_at"], rows["finished_at"], times)
        waiting = _active(rows["queued_at"], rows["started_at"], times)
        load_ax.plot(
            times - segment.start + offset,
            running,
            color="#2e7d32",
            label="running" if number == 0 else None,
        )
        load_ax.plot(
            times - segment.start + offset,
            waiting,
            color="#ef6c00",
            linestyle=":",
            label="queued" if number == 0 else None,
        )
        if number:
            for ax in (rate_ax, load_ax):
                ax.axvline(offset, color="#555", linestyle="--", linewidth=1)
            rate_ax.annotate(
                f"resumed after {_seconds_text(segment.gap_before_s)}",
                (offset, 1),
                xycoords=("data", "axes fraction"),
                xytext=(4, -12),
                textcoords="offset points",
                fontsize="small",
                color="#555",
            )
        offset += span
    rate_ax.set_ylabel("episodes/s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.legend(loc="lower right", fontsize="small")
    load_ax.set_ylabel("episodes")
    load_ax.set_ylim(bottom=0)
    load_ax.set_xlim(0, max(offset, 1e-3))
    load_ax.set_xlabel("seconds of activity (gaps between collect calls cut out)")
    load_ax.legend(loc="upper right", fontsize="small")
    return _img(figure, "episodes finished per second, running and queued, over time")


def _active(begins: pd.Series, ends: pd.Series, times: np.ndarray) -> np.ndarray:
    """How many ``[begin, end)`` intervals hold each of ``times``."""
    starts = np.sort(begins.to_numpy(dtype=float))
    stops = np.sort(ends.to_numpy(dtype=float))
    return np.searchsorted(starts, times, side="right") - np.searchsorted(stops, times, "right")


def _seconds_text(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def reward_range(frame: pd.DataFrame) -> tuple[float, float]:
    """The reward axis: [0, 1], widened to every reward the rows hold (rewards are any
    finite float, and a plot that cut them off would hide them)."""
    rewards = frame["reward"].to_numpy(dtype=float)
    if not len(rewards):
        return 0.0, 1.0
    return min(0.0, float(rewards.min())), max(1.0, float(rewards.max()))


def rewards_plot(frame: pd.DataFrame) -> str:
    """Reward histogram per environment over every reward's range; mean reward and the pass
    rate (reward >= ``PASS_REWARD``) per environment, each on its own axis."""
    figure, (hist_ax, mean_ax, pass_ax) = _figure(1, 3)
    envs, values = _by_env(frame, "reward")
    low, high = reward_range(frame)
    bins = 10 if (low, high) == (0.0, 1.0) else 20
    hist_ax.hist(values, bins=bins, range=(low, high), label=envs, color=_env_colours(envs))
    hist_ax.set_xlabel(f"reward ({low:g} to {high:g})")
    hist_ax.set_ylabel("episodes")
    hist_ax.legend(fontsize="small")
    means = [float(v.mean()) if len(v) else 0.0 for v in values]
    passed = [float((v >= PASS_REWARD).mean()) if len(v) else 0.0 for v in values]
    mean_ax.bar(envs, means, color=_env_colours(envs))
    mean_ax.axhline(0.0, color="#757575", linewidth=0.8)
    mean_ax.set_ylim(*_padded(low, high))
    mean_ax.set_ylabel("mean reward")
    pass_ax.bar(envs, passed, color="#2e7d32")
    pass_ax.set_ylim(0, 1.05)
    pass_ax.set_ylabel(f"pass rate (share with reward >= {PASS_REWARD:g})")
    return _img(figure, "reward histogram, mean reward and pass rate per environment")


def _padded(low: float, high: float) -> tuple[float, float]:
    pad = 0.05 * (high - low)
    return (low - pad if low < 0 else low), high + pad


def groups_plot(frame: pd.DataFrame) -> str:
    """Within-group reward std (GRPO groups: one task's samples), and the zero-spread share
    per environment."""
    figure, (hist_ax, bar_ax) = _figure(1, 2)
    stds = group_stds(frame)
    zero = zero_spread(frame, stds)
    env_of = frame.groupby("task_id")["environment"].first()
    envs = sorted(frame["environment"].unique())
    per_env = [stds[env_of[stds.index] == e].to_numpy() for e in envs]
    zero_per_env = [zero[env_of[zero.index] == e].to_numpy() for e in envs]
    # A std of rewards in [0, 1] is at most 0.5; wider rewards widen the axis to theirs.
    top = max(0.5, float(stds.max())) if len(stds) else 0.5
    edges = np.linspace(0, top, 21).tolist()
    hist_ax.hist(per_env, bins=edges, label=envs, color=_env_colours(envs))
    hist_ax.set_xlabel("reward std within a group (0: every sample scored the same)")
    hist_ax.set_ylabel("groups")
    hist_ax.legend(fontsize="small")
    shares = [float(v.mean()) if len(v) else 0.0 for v in zero_per_env]
    bar_ax.bar(envs, shares, color=_env_colours(envs))
    bar_ax.set_ylim(0, 1.05)
    bar_ax.set_ylabel("share of groups with zero spread")
    return _img(figure, "within-group reward spread")


def lengths_plot(frame: pd.DataFrame) -> str:
    """Turns, tool calls, prompt and completion tokens per episode, per environment."""
    figure, axes = _figure(2, 2)
    _env_hist(axes[0], frame, "m_turns", "turns (model calls) per episode", integer=True)
    _env_hist(axes[1], frame, "m_tool_calls", "tool calls per episode", integer=True)
    _env_hist(
        axes[2],
        frame,
        "m_tokens_in",
        "prompt tokens per episode (summed over turns)",
        integer=False,
    )
    _env_hist(axes[3], frame, "m_tokens_out", "completion tokens per episode", integer=False)
    return _img(figure, "turns, tool calls and token lengths per episode")


def time_plot(frame: pd.DataFrame) -> str:
    """Episode seconds, seconds queued before the start, and the split of episode time."""
    figure, (total_ax, queued_ax, split_ax) = _figure(1, 3)
    _env_hist(total_ax, frame, "m_seconds_total", "episode seconds", integer=False)
    _env_hist(
        queued_ax, frame, "m_seconds_queued", "seconds queued before the start", integer=False
    )
    sums = frame.groupby("environment")[
        ["m_seconds_model", "m_seconds_tools", "m_seconds_verify", "m_seconds_total"]
    ].sum()
    total = sums["m_seconds_total"].where(sums["m_seconds_total"] > 0, 1.0)
    parts = {
        "model": sums["m_seconds_model"] / total,
        "tools": sums["m_seconds_tools"] / total,
        "verify": sums["m_seconds_verify"] / total,
    }
    parts["other"] = (1 - sum(parts.values())).clip(lower=0)
    bottom = np.zeros(len(sums))
    for (name, share), colour in zip(
        parts.items(), ["#1f77b4", "#ff7f0e", "#9467bd", "#bdbdbd"], strict=True
    ):
        split_ax.bar(sums.index, share, bottom=bottom, label=name, color=colour)
        bottom += share.to_numpy()
    split_ax.set_ylabel("share of episode time")
    split_ax.set_ylim(0, 1.05)
    split_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _img(figure, "episode time, queued time and where episode time goes")


def statuses_plot(frame: pd.DataFrame) -> str:
    """Episodes per environment stacked by status, in the statuses' fixed colours."""
    counts = frame.groupby(["environment", "status"]).size().unstack(fill_value=0)
    order = [s for s in STATUS_COLOURS if s in counts.columns]
    order += sorted(set(counts.columns) - set(order))
    figure, (ax,) = _figure(1, 1, height=0.5 + 0.45 * max(len(counts), 2))
    left = np.zeros(len(counts))
    for status in order:
        ax.barh(counts.index, counts[status], left=left, label=status, color=status_colour(status))
        left += counts[status].to_numpy()
    ax.set_xlabel("episodes")
    ax.invert_yaxis()
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _img(figure, "statuses per environment")


def versions_plot(frame: pd.DataFrame) -> str:
    """Episodes and mean reward per policy version (a training run's progress)."""
    by_version = frame.groupby("policy_version")["reward"].agg(["size", "mean"])
    figure, (count_ax, reward_ax) = _figure(1, 2)
    count_ax.bar(by_version.index.astype(str), by_version["size"], color="#1f77b4")
    count_ax.set_xlabel("policy version (of the episode's first model call)")
    count_ax.set_ylabel("episodes")
    reward_ax.plot(by_version.index.astype(str), by_version["mean"], marker="o", color="#2e7d32")
    reward_ax.set_xlabel("policy version")
    reward_ax.set_ylabel("mean reward")
    reward_ax.set_ylim(*_padded(*reward_range(frame)))
    return _img(figure, "episodes and mean reward per policy version")
