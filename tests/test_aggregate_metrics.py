"""NeMo Gym's run figures (``POST /aggregate_metrics``) stay finite for any finite answers."""

from __future__ import annotations

import json
import statistics

import pytest

from rayrollout.envkit.nemo_gym.aggregate_metrics import aggregate_metrics

HUGE = 8.98846567431158e307  # half the largest float: two of them overflow a plain sum


@pytest.mark.parametrize(
    "rewards",
    [[HUGE, HUGE], [1.7e308, -1.7e308, 1e308, 1.7e308], [1.7e308, 1.7e308]],
    ids=["sum-overflows", "squares-overflow", "median-overflows"],
)
def test_values_near_the_float_limit_give_finite_figures(rewards):
    figures = aggregate_metrics([{"reward": r} for r in rewards])["agent_metrics"]
    json.dumps(figures, allow_nan=False)  # raises on inf or nan
    assert min(rewards) <= figures["mean/reward"] <= max(rewards)
    assert min(rewards) <= figures["median/reward"] <= max(rewards)
    assert figures["std/reward"] >= 0


def test_ordinary_values_give_the_statistics_modules_figures():
    rewards = [1.0, 0.0, 0.5, 0.25]
    figures = aggregate_metrics([{"reward": r} for r in rewards])["agent_metrics"]
    assert figures["mean/reward"] == statistics.fmean(rewards)
    assert figures["median/reward"] == statistics.median(rewards)
    assert figures["std/reward"] == statistics.pstdev(rewards)
