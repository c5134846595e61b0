"""``POST /aggregate_metrics``: run-level figures from verify answers, in NeMo Gym's naming.

``ng_collect_rollouts`` needs the route; the answer has NeMo Gym's three parts (agent,
group-level and key metrics) named ``<stat>/<field>``, so NeMo Gym's dashboards read it
unchanged. Masked samples are counted but left out of the statistics.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

__all__ = ["TASK_INDEX", "aggregate_metrics"]

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"


def _measurements(answer: dict[str, Any]) -> dict[str, float]:
    """The numeric top-level fields of one verify answer."""
    return {
        key: float(value)
        for key, value in answer.items()
        if not key.startswith("_ng_")
        and key != "mask_sample"
        and isinstance(value, int | float)
        and value == value  # NaN says nothing
    }


def _stats(values_by_field: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for field, values in sorted(values_by_field.items()):
        out[f"mean/{field}"] = _mean(values)
        out[f"max/{field}"] = max(values)
        out[f"min/{field}"] = min(values)
        out[f"median/{field}"] = _median(values)
        out[f"std/{field}"] = _std(values)
    return out


# Inputs near the float limit overflow a sum or a square: such a figure is computed again on
# values scaled into range, so finite inputs always give finite figures.
def _mean(values: list[float]) -> float:
    try:
        return statistics.fmean(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)


def _median(values: list[float]) -> float:
    middle = statistics.median(values)
    if math.isinf(middle):
        ordered = sorted(values)
        return ordered[len(ordered) // 2 - 1] / 2 + ordered[len(ordered) // 2] / 2
    return middle


def _std(values: list[float]) -> float:
    try:
        spread = statistics.pstdev(values)
    except OverflowError:
        spread = math.inf
    if math.isfinite(spread):
        return spread
    scale = max(abs(v) for v in values)
    return scale * statistics.pstdev([v / scale for v in values])


def _collect(answers: list[dict[str, Any]]) -> dict[str, list[float]]:
    values: dict[str, list[float]] = defaultdict(list)
    for answer in answers:
        for field, value in _measurements(answer).items():
            values[field].append(value)
    return values


def aggregate_metrics(verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """``AggregateMetrics`` of a run's verify answers (each a dict, as NeMo Gym posts them)."""
    if not verify_responses:
        return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    scored = [a for a in verify_responses if not a.get("mask_sample")]
    masked = len(verify_responses) - len(scored)
    agent_metrics: dict[str, Any] = _stats(_collect(scored))
    agent_metrics["num_rollouts"] = len(verify_responses)
    agent_metrics["num_repeats"] = len({a.get(ROLLOUT_INDEX, 0) for a in verify_responses})
    if masked:
        agent_metrics["num_masked"] = masked
    by_task: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for answer in scored:
        by_task[answer.get(TASK_INDEX, 0)].append(answer)
    groups = [
        {TASK_INDEX: task, **_stats(_collect(answers))}
        for task, answers in sorted(by_task.items(), key=lambda i: (type(i[0]).__name__, i[0]))
    ]
    key_metrics = {k: v for k, v in agent_metrics.items() if k.startswith("mean/")}
    return {
        "group_level_metrics": groups,
        "agent_metrics": agent_metrics,
        "key_metrics": key_metrics,
    }
