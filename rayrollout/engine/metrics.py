"""Live run metrics through ``ray.util.metrics``: they reach Ray's Prometheus endpoint and
dashboard with no extra service.

The histograms are observed by each worker as its episodes end (``EpisodeHistograms``); the
counters and gauges by the engine, once per tag set from the workers' tallies (``RunMetrics``),
so the engine's cost per report does not grow with the episodes in it. Ray exports each
name with a ``ray_`` prefix (``ray_rayrollout_episodes_finished_total``).

| name | kind | tags |
| --- | --- | --- |
| rayrollout_episodes_submitted | counter | environment |
| rayrollout_episodes_finished | counter | environment, status |
| rayrollout_episodes_in_flight | gauge | |
| rayrollout_reward | histogram | environment |
| rayrollout_policy_call_seconds | histogram | environment |
| rayrollout_tool_call_seconds | histogram | environment, tool |
| rayrollout_verify_seconds | histogram | environment |
| rayrollout_episode_seconds | histogram | environment |
| rayrollout_tokens | counter | environment, direction (in, out) |
| rayrollout_writer_buffered_rows | gauge | |
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ray.util import metrics

from rayrollout.engine.tally import Tally

__all__ = ["METRIC_NAMES", "EpisodeHistograms", "RunMetrics"]

_SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]
# Rewards are any finite float. Ray's histogram boundaries must be positive, so every
# reward at or below 0.0001 (negative ones included) shares the first bucket; the tenths
# split [0, 1], and the rest split rewards above 1. The histogram's sum and count stay exact
# for any reward, so its mean does too.
_REWARD = [0.0001, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.9999, 1.0001, 2, 5, 10, 100]
METRIC_NAMES = (
    "rayrollout_episodes_submitted",
    "rayrollout_episodes_finished",
    "rayrollout_episodes_in_flight",
    "rayrollout_reward",
    "rayrollout_policy_call_seconds",
    "rayrollout_tool_call_seconds",
    "rayrollout_verify_seconds",
    "rayrollout_episode_seconds",
    "rayrollout_tokens",
    "rayrollout_writer_buffered_rows",
)


def _latency(name: str, description: str, tag_keys: tuple[str, ...]) -> metrics.Histogram:
    """A histogram of seconds; every latency shares the buckets so that they compare."""
    return metrics.Histogram(name, description, boundaries=_SECONDS, tag_keys=tag_keys)


class EpisodeHistograms:
    """The run's per-episode histograms; each worker observes its own episodes."""

    def __init__(self, namespace: str) -> None:
        self.base = {"namespace": namespace}
        env = ("namespace", "environment")
        self.reward = metrics.Histogram(
            "rayrollout_reward", "Episode rewards.", boundaries=_REWARD, tag_keys=env
        )
        self.policy_seconds = _latency(
            "rayrollout_policy_call_seconds", "Latency of one model call, retries included.", env
        )
        self.tool_seconds = _latency(
            "rayrollout_tool_call_seconds",
            "Latency of one tool call.",
            ("namespace", "environment", "tool"),
        )
        self.verify_seconds = _latency("rayrollout_verify_seconds", "Latency of the verifier.", env)
        self.episode_seconds = _latency(
            "rayrollout_episode_seconds", "Wall time of an episode.", env
        )

    def observe(self, row: dict[str, Any]) -> None:
        """Record one finished episode (its row, or its ``chunks.summarize`` view)."""
        tags = {**self.base, "environment": row["environment"]}
        m = row["metrics"]
        self.reward.observe(row["reward"], tags=tags)
        self.episode_seconds.observe(m["seconds_total"], tags=tags)
        for turn in row["turns"]:
            self.policy_seconds.observe(turn["seconds"], tags=tags)
        for event in m["timeline"]:
            if event["kind"] == "tool":
                self.tool_seconds.observe(event["seconds"], tags={**tags, "tool": event["name"]})
        if m["seconds_verify"]:
            self.verify_seconds.observe(m["seconds_verify"], tags=tags)


class RunMetrics:
    """The run's counters and gauges; one instance lives in the engine actor."""

    def __init__(self, namespace: str) -> None:
        base = {"namespace": namespace}
        env, env_status = ("namespace", "environment"), ("namespace", "environment", "status")
        self.base = base
        self.submitted = metrics.Counter(
            "rayrollout_episodes_submitted", "Episodes queued for the workers.", tag_keys=env
        )
        self.finished = metrics.Counter(
            "rayrollout_episodes_finished",
            "Episodes finished, by final status.",
            tag_keys=env_status,
        )
        self.in_flight = metrics.Gauge(
            "rayrollout_episodes_in_flight",
            "Episodes on workers now: running, or waiting there for a running slot.",
            tag_keys=("namespace",),
        )
        self.tokens = metrics.Counter(
            "rayrollout_tokens",
            "Tokens in prompts and completions.",
            tag_keys=("namespace", "environment", "direction"),
        )
        self.buffered = metrics.Gauge(
            "rayrollout_writer_buffered_rows",
            "Finished rows waiting for the next part file.",
            tag_keys=("namespace",),
        )

    def on_submit(self, environments: list[str]) -> None:
        for environment, n in Counter(environments).items():
            self.submitted.inc(n, tags={**self.base, "environment": environment})

    def on_tally(self, tally: Tally, in_flight: int, buffered: int) -> None:
        """Count a worker's tally of finished episodes (one record per tag set: each costs
        the engine tens of microseconds) and set the engine's current load."""
        for env, sums in tally.by_env.items():
            tags = {**self.base, "environment": env}
            for status, n in sums.statuses.items():
                self.finished.inc(n, tags={**tags, "status": status})
            for direction, n in (("in", sums.tokens_in), ("out", sums.tokens_out)):
                if n:
                    self.tokens.inc(n, tags={**tags, "direction": direction})
        self.set_load(in_flight, buffered)

    def set_load(self, in_flight: int, buffered: int) -> None:
        """Set the gauges. The engine also calls this every second: Ray's metrics agent
        drops a gauge not set again within two export intervals."""
        self.in_flight.set(in_flight, tags=self.base)
        self.buffered.set(buffered, tags=self.base)
