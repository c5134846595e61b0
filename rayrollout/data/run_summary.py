"""A run's figures from its rows alone: what the engine's ``stats()`` said, after the fact.

Duration and throughput come from each episode's own times (``episode_table``). A resumed
run is cut into *segments* (a new run id, or a gap over ``GAP_S``), so a gap never dilutes
throughput; the pass rate counts rewards of at least ``PASS_REWARD``.
"""

from __future__ import annotations

import pandas as pd
from pydantic import Field

from rayrollout.figures import Figures

__all__ = [
    "GAP_S",
    "PASS_REWARD",
    "SPREAD_TOLERANCE",
    "GroupSpread",
    "RunSummary",
    "Segment",
    "group_stds",
    "segment_labels",
    "summarize",
    "zero_spread",
]

GAP_S = 1.0
"""Seconds with nothing queued or running after which the next episode opens a new segment."""

PASS_REWARD = 1.0
"""The reward an episode needs to count as passed (the pass rate's threshold): rewards are
any float, so for an environment whose success is not 1 the pass rate is only a count of
rewards >= 1; the mean and the range speak for it."""

SPREAD_TOLERANCE = 1e-9
"""A group has zero spread when its std is at most this share of its largest |reward| (at
least 1), as ``rayrollout.engine.groups`` judges dynamic sampling."""


class Segment(Figures):
    """A stretch of continuous activity: one collect call, or part of one if it idled."""

    runs: list[str] = Field(description="Run ids (part names) whose episodes it holds.")
    start: float = Field(description="Unix seconds its first episode was queued.")
    end: float = Field(description="Unix seconds its last episode finished.")
    episodes: int
    seconds: float = Field(description="end - start.")
    episodes_per_s: float = Field(description="episodes / seconds (0 for a zero span).")
    gap_before_s: float = Field(description="Idle seconds since the previous one ended (0 first).")


class GroupSpread(Figures):
    """GRPO groups (the samples of one task) and how much their rewards differ.

    A group whose samples all got the same reward has zero advantage for every sample: it
    teaches a GRPO step nothing, which is why its share is the figure to watch.
    """

    groups: int = Field(description="Tasks with two samples or more.")
    single_sample_tasks: int = Field(description="Tasks with one sample: no spread to measure.")
    zero_spread: int = Field(description="Groups whose samples all have the same reward.")
    zero_spread_share: float = Field(description="zero_spread / groups (0 without groups).")
    mean_std: float = Field(description="Mean within-group reward std (population, ddof=0).")
    samples_per_group: dict[int, int] = Field(description="Group size -> groups of that size.")


class RunSummary(Figures):
    """The headline figures of a run folder (every collect call in it together)."""

    episodes: int
    tasks: int
    environments: list[str]
    models: list[str] = Field(description="Policy model names the rows carry ('' unset).")
    policy_versions: dict[int, int] = Field(description="Version -> episodes that began on it.")
    turns_across_updates: int = Field(
        default=0, description="Policy turns a weight update cut: tokens of two versions."
    )
    statuses: dict[str, int]
    errors: int = Field(description="Episodes whose status is not ok.")
    close_errors: int = Field(description="Episodes whose environment session failed to close.")
    mean_reward: float
    min_reward: float = Field(description="The lowest reward (0 without episodes).")
    max_reward: float = Field(description="The highest reward (0 without episodes).")
    pass_rate: float = Field(description=f"Share of episodes with reward >= {PASS_REWARD}.")
    active_s: float = Field(description="Seconds of work: the segments' spans summed.")
    wall_s: float = Field(description="First episode queued to last finished, gaps included.")
    episodes_per_s: float = Field(description="episodes / active_s (0 for a zero span).")
    mean_queued_s: float = Field(description="Mean seconds an episode waited before it began.")
    segments: list[Segment]
    groups: GroupSpread


def segment_labels(frame: pd.DataFrame, gap_s: float = GAP_S) -> pd.Series:
    """The segment number (0, 1, ...) of every row of an episode table, in time order.

    Rows are swept in the order they were queued; a row opens a new segment when it was
    queued more than ``gap_s`` after every earlier episode had finished, or when its run id
    differs from the previous row's and no earlier episode was still running.
    """
    if frame.empty:
        return pd.Series([], dtype="int64", index=frame.index)
    order = frame.sort_values("queued_at", kind="stable")
    done_before = order["finished_at"].cummax().shift(1)
    new_run = order["run"] != order["run"].shift(1)
    opens = (order["queued_at"] > done_before + gap_s) | (
        new_run & (order["queued_at"] >= done_before)
    )
    opens.iloc[0] = True
    return (opens.cumsum() - 1).astype("int64").reindex(frame.index)


def _segments(frame: pd.DataFrame, labels: pd.Series) -> list[Segment]:
    segments: list[Segment] = []
    for _, rows in frame.groupby(labels, sort=True):
        start, end = float(rows["queued_at"].min()), float(rows["finished_at"].max())
        seconds = max(0.0, end - start)
        gap = max(0.0, start - segments[-1].end) if segments else 0.0
        segments.append(
            Segment(
                runs=sorted(rows["run"].unique()),
                start=start,
                end=end,
                episodes=len(rows),
                seconds=seconds,
                episodes_per_s=len(rows) / seconds if seconds > 0 else 0.0,
                gap_before_s=gap,
            )
        )
    return segments


def group_stds(frame: pd.DataFrame) -> pd.Series:
    """Within-group reward std (ddof=0, as GRPO normalises) per task with 2+ samples."""
    sizes = frame.groupby("task_id")["reward"].size()
    grouped = frame[frame["task_id"].isin(sizes[sizes >= 2].index)].groupby("task_id")
    return grouped["reward"].std(ddof=0)


def zero_spread(frame: pd.DataFrame, stds: pd.Series) -> pd.Series:
    """Per group of ``stds`` (``group_stds``): whether its rewards are all alike, beyond float
    noise (``SPREAD_TOLERANCE`` of its largest |reward|, at least 1)."""
    largest = frame.groupby("task_id")["reward"].agg(lambda r: r.abs().max())
    return stds <= SPREAD_TOLERANCE * largest.reindex(stds.index).clip(lower=1.0)


def _group_spread(frame: pd.DataFrame) -> GroupSpread:
    sizes = frame.groupby("task_id").size()
    stds = group_stds(frame)
    zero = int(zero_spread(frame, stds).sum())
    return GroupSpread(
        groups=len(stds),
        single_sample_tasks=int((sizes == 1).sum()),
        zero_spread=zero,
        zero_spread_share=zero / len(stds) if len(stds) else 0.0,
        mean_std=float(stds.mean()) if len(stds) else 0.0,
        samples_per_group={int(k): int(v) for k, v in sizes[sizes >= 2].value_counts().items()},
    )


def summarize(frame: pd.DataFrame, gap_s: float = GAP_S) -> RunSummary:
    """The figures of an episode table (``load_episodes``); see the module docstring."""
    segments = _segments(frame, segment_labels(frame, gap_s))
    active = sum(s.seconds for s in segments)
    episodes = len(frame)
    statuses = frame["status"].value_counts()
    return RunSummary(
        episodes=episodes,
        tasks=int(frame["task_id"].nunique()),
        environments=sorted(frame["environment"].unique()),
        models=sorted(frame["model"].fillna("").unique()),
        policy_versions={
            int(k): int(v) for k, v in frame["policy_version"].value_counts().sort_index().items()
        },
        turns_across_updates=int(frame["m_turns_across_updates"].fillna(0).sum()),
        statuses={str(k): int(v) for k, v in statuses.items()},
        errors=int((frame["status"] != "ok").sum()),
        close_errors=int(frame["close_error"].notna().sum()),
        mean_reward=float(frame["reward"].mean()) if episodes else 0.0,
        min_reward=float(frame["reward"].min()) if episodes else 0.0,
        max_reward=float(frame["reward"].max()) if episodes else 0.0,
        pass_rate=float((frame["reward"] >= PASS_REWARD).mean()) if episodes else 0.0,
        active_s=active,
        wall_s=segments[-1].end - segments[0].start if segments else 0.0,
        episodes_per_s=episodes / active if active > 0 else 0.0,
        mean_queued_s=float(frame["m_seconds_queued"].mean()) if episodes else 0.0,
        segments=segments,
        groups=_group_spread(frame),
    )
