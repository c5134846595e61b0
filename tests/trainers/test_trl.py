"""TRL 1.16 takes rayrollout as its rollout: in TRL's own venv, its ``GRPOTrainer`` runs 2
optimizer steps of a tiny model with ``RayrolloutRollout`` as ``rollout_func`` on multi-turn
weather episodes, and the ``weight_sync`` callback pushes after each step. Every id, mask
value and logprob TRL got equals the row the service streamed; the second step's episodes
were played under the version the first push set. (A model learning through it is a
benchmark's job, not this test's.)"""

from __future__ import annotations

import pytest
from checks import check, check_versions, run_driver

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(900)]


def test_trl_grpo_trains_on_rayrollout_rollouts_and_pushes_weights(service, tmp_path):
    out = tmp_path / "trl.json"
    record = run_driver(
        "trl",
        "trl_driver.py",
        service["url"],
        service["token"],
        out,
        tmp_path,
        out=out,
        timeout=840,
    )
    calls = record["calls"]
    assert len(calls) >= 2
    problems = []
    for call in calls:
        answer, rows = call["answer"], call["rows"]
        prompts = call["prompts"]
        # TRL's contract: each prompt num_generations (4) times in a row, one answer each.
        assert len(prompts) == len(rows) == len(answer["completion_ids"]) == 8
        for i, row in enumerate(rows):
            assert prompts[i] == prompts[i - i % 4]  # runs of num_generations
            user = next(m for m in row["messages"] if m["role"] == "user")
            assert user["content"] == prompts[i]  # each answer is its own prompt's episode
            problems += check(
                row,
                answer["prompt_ids"][i],
                answer["completion_ids"][i],
                answer["env_mask"][i],
                answer["logprobs"][i],
            )
            problems += check_versions(
                row, answer["env_mask"][i], answer["rayrollout_token_versions"][i]
            )
            assert answer["rayrollout_reward"][i] == row["reward"]
            assert answer["rayrollout_status"][i] == "ok"
            assert min(len(row["turns"]), 2) == 2  # a tool call, then the answer
    assert problems == []
    # One push per optimizer step; the next batch was played by the pushed version.
    assert [step for step, _ in record["pushed"]] == [1, 2]
    versions = [v for _, v in record["pushed"]]
    assert versions[1] == versions[0] + 1
    assert set(calls[1]["answer"]["rayrollout_policy_version"]) == {versions[0]}
    assert record["saved"] == ["step-1", "step-2"]
    losses = [entry for entry in record["log"] if "loss" in entry]
    assert len(losses) == 2
    # Samples older than max_staleness (0) versions: masked, flagged, and too many raise.
    assert record["stale_error"] and "8 of 8 samples dropped" in record["stale_error"]
    assert record["stale_status"] == ["stale"] * 8
    assert all(set(mask) == {0} for mask in record["stale_masks"])
    # Truncated episodes: masked unless named trainable, then their own masks.
    assert all(set(mask) == {0} for mask in record["truncated_masks_by_default"])
    assert record["truncated_masks_when_trainable"] == calls[-1]["answer"]["env_mask"]
