"""What a batch of finished episodes adds to the run's figures (``Tally``), summed where the
episodes finish: in their worker.

A worker sums its episodes per environment as they end and sends the sums on its next
report, so the engine actor merges a few numbers per environment and report instead of
reading every episode (one actor for the whole run, so its CPU per episode bounds the run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rayrollout.engine.feeding import loop_end

__all__ = ["EnvTally", "Tally"]


@dataclass(slots=True)
class EnvTally:
    """Sums over one environment's finished episodes (``RunStats`` and ``RunMetrics`` read
    them); ``seconds`` keeps each episode's wall time, for the percentiles' sample."""

    episodes: int = 0
    reward_sum: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    close_errors: int = 0
    turns: int = 0
    tool_calls: int = 0
    seconds_model: float = 0.0
    seconds_tools: float = 0.0
    seconds_verify: float = 0.0
    seconds_total: float = 0.0
    seconds_queued: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Tally:
    """Sums over a batch of finished episodes, per environment, and when each episode's
    agent loop ended (``ends``, by its worker's clock: ``Refill`` sizes the reserve from
    them)."""

    by_env: dict[str, EnvTally] = field(default_factory=dict)
    ends: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, rows: list[dict[str, Any]]) -> Tally:
        """The tally of these rows (or of their ``chunks.summarize`` views)."""
        tally = cls()
        for row in rows:
            tally.add(row)
        return tally

    @property
    def episodes(self) -> int:
        return sum(env.episodes for env in self.by_env.values())

    def add(self, row: dict[str, Any]) -> None:
        """Count one finished episode's row (or its ``chunks.summarize`` view)."""
        env = self.by_env.get(row["environment"])
        if env is None:
            env = self.by_env[row["environment"]] = EnvTally()
        metrics = row["metrics"]
        env.episodes += 1
        env.reward_sum += row["reward"]
        status = row["status"]
        env.statuses[status] = env.statuses.get(status, 0) + 1
        env.close_errors += bool(row.get("close_error"))
        env.turns += metrics["turns"]
        env.tool_calls += metrics["tool_calls"]
        env.seconds_model += metrics["seconds_model"]
        env.seconds_tools += metrics["seconds_tools"]
        env.seconds_verify += metrics["seconds_verify"]
        seconds = metrics["seconds_total"]
        env.seconds_total += seconds
        env.seconds_queued += metrics.get("seconds_queued") or 0.0
        env.tokens_in += metrics.get("tokens_in") or 0
        env.tokens_out += metrics.get("tokens_out") or 0
        env.seconds.append(seconds)
        end = loop_end(metrics)
        if end is not None:
            self.ends.append(end)
