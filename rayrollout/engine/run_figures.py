"""What the engine hands back about a run: typed figures, one model per answer.

``EngineActor.progress``/``finish`` answer a ``RunSnapshot`` (the progress bar and summary
read it) and ``stats`` an ``EngineStats`` (what a training loop logs): as models, a misspelt
key fails where it is written, not at the end of a long run. Each also reads as a mapping
(``stats["mean_reward"]``, ``dict(stats)``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rayrollout.data.figures import Figures
from rayrollout.data.writer import WriterFigures
from rayrollout.engine.groups import SamplingCounts
from rayrollout.engine.stats import EnvStats

__all__ = [
    "EngineStats",
    "EnvSummary",
    "Figures",
    "PolicyCalls",
    "PolicyState",
    "RunSnapshot",
    "WriterFigures",
]


class RunSnapshot(Figures):
    """The current batch's figures: ``progress()`` while it runs, ``finish()`` at its end."""

    elapsed_s: float = Field(description="Seconds since the engine (or this batch) began.")
    in_flight: int = Field(description="Episodes on workers now (running, or waiting there).")
    episodes_per_s: float = Field(description="Finished episodes per second of elapsed time.")
    total: EnvStats = Field(description="Counters over every environment.")
    by_env: dict[str, EnvStats] = Field(description="Counters per environment name.")
    queued: int = Field(default=0, description="Episode specs waiting in the engine's queue.")
    rows_written: int = Field(
        default=0, description="Rows in parts on disk (buffered rows not counted)."
    )
    writer: WriterFigures = Field(
        default_factory=WriterFigures, description="Parts, rows and seconds of the writer."
    )
    parts: list[str] = Field(
        default_factory=list, description="``finish`` only: the parts this batch wrote."
    )
    worker_messages: int = Field(
        default=0,
        description="Ray messages between the engine actor and its workers in this batch: "
        "calls that send episodes and their answers, sessions opened, reports back.",
    )


class EnvSummary(Figures):
    """One environment's figures in ``stats()``: means and percentiles, not raw counters."""

    episodes: int
    mean_reward: float
    errors: int = Field(description="Episodes whose status is not ok.")
    close_errors: int = Field(description="Episodes whose environment session failed to close.")
    statuses: dict[str, int]
    turns_per_episode: float
    p50_s: float = Field(description="Median episode seconds (of a bounded sample).")
    p95_s: float
    time_split: dict[str, float] = Field(description="Share of episode time per part.")
    mean_queued_s: float = Field(description="Mean seconds queued before the start.")


class PolicyState(Figures):
    """The policy's version and pause state (``WeightSync``)."""

    version: int
    paused: bool
    pause_mode: str
    updates: int = Field(description="Weight updates done.")
    last_update: dict[str, Any] = Field(description="What the last update reported.")


class PolicyCalls(Figures):
    """Model calls summed over every worker's gate."""

    in_flight: int = 0
    calls: int = 0
    held: int = Field(default=0, description="Calls that waited for a resume.")
    aborted: int = Field(default=0, description="Calls aborted by a pause and sent again.")
    stale_restarts: int = Field(default=0, description="Episodes restarted past max_staleness.")
    interrupted: int = Field(
        default=0, description="Calls a pause stopped, their tokens kept and continued."
    )
    kept_tokens: int = Field(default=0, description="Tokens those calls had when stopped.")
    discarded_tokens: int = Field(
        default=0,
        description="Tokens of stopped calls generated again (a constrained call that "
        "cannot resume its constraint).",
    )


class EngineStats(Figures):
    """``EngineActor.stats()``: what a training loop logs each step."""

    episodes_done: int
    episodes_in_flight: int
    episodes_per_s: float
    elapsed_s: float
    mean_reward: float
    errors: int
    close_errors: int
    statuses: dict[str, int]
    time_split: dict[str, float]
    mean_queued_s: float
    by_env: dict[str, EnvSummary]
    queued: int
    rows_written: int
    writer: WriterFigures
    policy: PolicyState
    dynamic_sampling: SamplingCounts
    policy_calls: PolicyCalls | None = Field(
        default=None, description="None from ``stats_snapshot``, which asks no worker."
    )
