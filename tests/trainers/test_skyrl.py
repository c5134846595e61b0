"""SkyRL 0.4.0 takes rayrollout as its generator: in SkyRL's own venv (Python 3.12, its own
Ray), its ``prepare_generator_input`` feeds ``RayrolloutGenerator``, whose output passes its
``validate_generator_output``; every value equals the row the service streamed."""

from __future__ import annotations

from collections import Counter

import pytest
from checks import check, check_versions, run_driver

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(600)]


def test_skyrl_generator_output_is_validated_by_skyrl_and_equals_the_rows(service, tmp_path):
    out = tmp_path / "skyrl.json"
    record = run_driver("skyrl", "skyrl_driver.py", service["url"], service["token"], out, out=out)
    rows = record["rows"]
    assert len(rows) == len(record["response_ids"]) == 16
    # SkyRL's order: each uid 4 times, repetition ids 0..3; one row per (task, sample).
    assert [tuple(t) for t in record["trajectory_ids"]] == [
        (uid, r) for uid in dict.fromkeys(record["uids"]) for r in range(4)
    ]
    assert [row["task_id"] for row in rows] == [t[0] for t in record["trajectory_ids"]]
    assert len({(r["task_id"], r["sample_index"]) for r in rows}) == 16
    problems = []
    for i, row in enumerate(rows):
        problems += check(
            row,
            record["prompt_token_ids"][i],
            record["response_ids"][i],
            record["loss_masks"][i],
            record["rollout_logprobs"][i],
        )
        problems += check_versions(
            row, record["loss_masks"][i], record["rayrollout_token_versions"][i]
        )
        assert record["rewards"][i] == row["reward"]
    assert problems == []
    # Multi-turn: a tool call and its result, then the answer.
    turns = Counter(len(row["turns"]) for row in rows)
    assert min(turns) >= 2, turns
    assert all(0 in mask and 1 in mask for mask in record["loss_masks"])
    assert record["stop_reasons"] == ["stop"] * 16
    assert record["rollout_metrics"]["rayrollout/failed_episodes"] == 0
