"""Running figures of a run, per environment: what the progress bar and summary table show.

Kept as counters and a bounded sample of episode times, so memory stays flat however many
episodes run.
"""

from __future__ import annotations

import random
import time
from typing import Any

from pydantic import ConfigDict, Field

from rayrollout.engine.tally import Tally
from rayrollout.figures import Figures

__all__ = ["EnvStats", "RunStats"]

_SAMPLE_SIZE = 10_000


class EnvStats(Figures):
    """Counters of one environment (or of the whole run); the summary table reads them."""

    model_config = ConfigDict(extra="ignore")  # older engines' snapshots may carry more

    episodes: int = 0
    reward_sum: float = 0.0
    statuses: dict[str, int] = Field(default_factory=dict)
    close_errors: int = Field(
        default=0, description="Episodes whose environment session failed to close."
    )
    turns: int = 0
    tool_calls: int = 0
    seconds_model: float = Field(default=0.0, description="Summed over episodes.")
    seconds_tools: float = 0.0
    seconds_verify: float = 0.0
    seconds_total: float = 0.0
    seconds_queued: float = Field(default=0.0, description="Before the start, summed.")
    seconds_sample: list[float] = Field(default_factory=list)

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.episodes if self.episodes else 0.0

    def time_split(self) -> dict[str, float]:
        """Where an episode's wall time goes, as fractions: model, tools, verify, other
        (the agent's own work and waiting for the worker's event loop)."""
        if self.seconds_total <= 0:
            return {"model": 0.0, "tools": 0.0, "verify": 0.0, "other": 0.0}
        parts = {
            "model": self.seconds_model,
            "tools": self.seconds_tools,
            "verify": self.seconds_verify,
        }
        split = {k: v / self.seconds_total for k, v in parts.items()}
        split["other"] = max(0.0, 1.0 - sum(split.values()))
        return split

    @property
    def mean_queued_s(self) -> float:
        """Mean seconds an episode waited in the engine before it started."""
        return self.seconds_queued / self.episodes if self.episodes else 0.0

    @property
    def errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != "ok")

    def percentile(self, q: float) -> float:
        """Episode seconds at quantile ``q`` (0-1) of the sampled episodes."""
        if not self.seconds_sample:
            return 0.0
        ordered = sorted(self.seconds_sample)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _sample(sample: list[float], seen: int, seconds: list[float]) -> None:
    """Reservoir sampling of episode times (``seen`` of them taken in so far): the
    percentiles stay honest with bounded memory."""
    for value in seconds:
        seen += 1
        if len(sample) < _SAMPLE_SIZE:
            sample.append(value)
        else:
            slot = random.randrange(seen)
            if slot < _SAMPLE_SIZE:
                sample[slot] = value


class RunStats:
    """Accumulates finished rows into per-environment and total figures."""

    def __init__(self) -> None:
        self.by_env: dict[str, EnvStats] = {}
        self.total = EnvStats()
        self.started = time.monotonic()
        self.in_flight = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Count finished rows (or their ``chunks.summarize`` views)."""
        self.merge(Tally.of(rows))

    def merge(self, tally: Tally) -> None:
        """Count a worker's tally of finished episodes: a few sums per environment, however
        many episodes it holds (the episode times go to the percentiles' sample)."""
        for name, env in tally.by_env.items():
            by_env = self.by_env.get(name)
            if by_env is None:
                by_env = self.by_env[name] = EnvStats()
            for stats in (self.total, by_env):
                stats.episodes += env.episodes
                stats.reward_sum += env.reward_sum
                statuses = stats.statuses
                for status, n in env.statuses.items():
                    statuses[status] = statuses.get(status, 0) + n
                stats.close_errors += env.close_errors
                stats.turns += env.turns
                stats.tool_calls += env.tool_calls
                stats.seconds_model += env.seconds_model
                stats.seconds_tools += env.seconds_tools
                stats.seconds_verify += env.seconds_verify
                stats.seconds_total += env.seconds_total
                stats.seconds_queued += env.seconds_queued
                _sample(stats.seconds_sample, stats.episodes - env.episodes, env.seconds)

    def summary(self) -> dict[str, Any]:
        """The run's part of ``EngineStats`` (``EngineActor.stats``): flat, means not sums."""
        elapsed = time.monotonic() - self.started
        return {
            "episodes_done": self.total.episodes,
            "episodes_in_flight": self.in_flight,
            "episodes_per_s": self.total.episodes / elapsed if elapsed > 0 else 0.0,
            "elapsed_s": elapsed,
            "mean_reward": self.total.mean_reward,
            "errors": self.total.errors,
            "close_errors": self.total.close_errors,
            "statuses": dict(self.total.statuses),
            "time_split": self.total.time_split(),
            "mean_queued_s": self.total.mean_queued_s,
            "by_env": {
                name: {
                    "episodes": s.episodes,
                    "mean_reward": s.mean_reward,
                    "errors": s.errors,
                    "close_errors": s.close_errors,
                    "statuses": dict(s.statuses),
                    "turns_per_episode": s.turns / s.episodes if s.episodes else 0.0,
                    "p50_s": s.percentile(0.5),
                    "p95_s": s.percentile(0.95),
                    "time_split": s.time_split(),
                    "mean_queued_s": s.mean_queued_s,
                }
                for name, s in sorted(self.by_env.items())
            },
        }

    def snapshot(self) -> dict[str, Any]:
        """The run's part of ``RunSnapshot`` (progress and finish): totals, per environment,
        rate. Copies, so the snapshot does not change under a caller in the engine."""
        elapsed = time.monotonic() - self.started
        return {
            "elapsed_s": elapsed,
            "in_flight": self.in_flight,
            "episodes_per_s": self.total.episodes / elapsed if elapsed > 0 else 0.0,
            "total": _copy(self.total),
            "by_env": {name: _copy(s) for name, s in sorted(self.by_env.items())},
        }


def _copy(stats: EnvStats) -> EnvStats:
    """A copy of ``stats`` that shares nothing with it, its containers copied whole: a deep
    copy walks the 10,000 sampled times one by one, on every progress poll (twice a second)."""
    return stats.model_copy(
        update={"statuses": dict(stats.statuses), "seconds_sample": list(stats.seconds_sample)}
    )
