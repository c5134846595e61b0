"""verl 0.9.1 takes rayrollout as its rollout: in verl's own venv, its trainer path (hydra
config, ``collate_fn``, ``DataProto``, ``repeat``, the ``agent_loop_manager_class`` loaded and
built as its trainer does, ``union``, ``extract_reward``, GRPO's ``compute_advantage``) runs
one rollout step of 64 multi-turn weather episodes through ``RayrolloutAgentLoopManager``.
Every id, mask value and logprob in verl's padded tensors equals the engine's row, read back
from the run's output folder."""

from __future__ import annotations

import time

import pytest
from checks import check, check_versions, run_driver

from rayrollout import read_trajectories
from rayrollout.client import RolloutClient

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(600)]


def test_verl_agent_loop_manager_dataproto_equals_the_engine_rows(service, tmp_path):
    out = tmp_path / "verl.json"
    record = run_driver("verl", "verl_driver.py", service["url"], service["token"], out, out=out)
    samples = record["samples"]
    assert len(samples) == 64
    # verl's padding: prompts to prompt_length, responses to response_length, one row each.
    shapes = record["shapes"]
    assert shapes["prompts"] == [64, 256] and shapes["responses"] == [64, 512]
    assert shapes["input_ids"] == shapes["attention_mask"] == shapes["position_ids"] == [64, 768]
    assert shapes["response_mask"] == shapes["rollout_log_probs"] == shapes["rm_scores"]
    # verl's order: each uid N times in a row, one episode per (task, sample).
    uids = [s["uid"] for s in samples]
    assert all(uids[i] == uids[i - i % 4] for i in range(64))
    assert [s["task_id"] for s in samples] == uids
    assert len({(s["task_id"], s["sample_index"]) for s in samples}) == 64

    # The engine writes rows within output.flush_interval_s of finishing them.
    output_dir = RolloutClient(service["url"], service["token"]).output_dir()
    wanted = {(s["task_id"], s["sample_index"]) for s in samples}
    deadline = time.monotonic() + 120
    while True:
        rows = {}
        for trajectory in read_trajectories(output_dir):
            row = trajectory.model_dump(mode="json")
            rows[(row["task_id"], row["sample_index"])] = row
        if wanted <= rows.keys() or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert wanted <= rows.keys(), f"{len(wanted - rows.keys())} rows never reached {output_dir}"
    problems = []
    for s in samples:
        row = rows[(s["task_id"], s["sample_index"])]
        problems += check(row, s["prompt_ids"], s["response_ids"], s["mask"], s["logprobs"])
        problems += check_versions(row, s["mask"], s["token_versions"])
        assert s["reward"] == pytest.approx(row["reward"]) == pytest.approx(s["reward_at_last"])
        assert s["status"] == row["status"] == "ok"
        assert s["input_ids_match"] and s["mask_outside"] == 0
        assert s["positions"] == list(range(len(s["prompt_ids"]) + len(s["response_ids"])))
        assert s["num_turns"] == len(row["turns"]) >= 2  # a tool call, then the answer
    assert problems == []
    assert all(0 in s["mask"] and 1 in s["mask"] for s in samples)
    assert record["timing"]["rayrollout/failed_episodes"] == 0
    assert record["timing"]["rayrollout/truncated_sequences"] == 0
    # A failed episode: kept in place, masked out, flagged and counted; too many raise.
    failed = record["failed"]
    assert failed["status"] == ["error", "ok", "ok", "ok"]
    assert failed["error"][0] == "the tool crashed"
    assert failed["mask_sums"][0] == 0 and min(failed["mask_sums"][1:]) > 0
    assert failed["responses_kept"] and failed["count"] == 1
    assert failed["too_many"] and "1 of 4 episodes failed" in failed["too_many"]
