"""OpenRLHF 0.11.2 takes rayrollout as its agent executor: in OpenRLHF's own venv, its loader
builds the ``AgentExecutor`` of ``rayrollout/integrations/openrlhf.py``, its
``RolloutRayActor.generate_responses`` plays multi-turn weather episodes through it, and its
``_process_response_into_experience`` and ``Experience.concat_experiences`` take the answers.
Every id, action-mask value and logprob of OpenRLHF's ``Experience`` equals the row the
service streamed (``vllm`` mocked, as OpenRLHF's own tests mock it)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from checks import ROOT, check, check_versions, run_driver

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(600)]

AGENT = ROOT / "rayrollout" / "integrations" / "openrlhf.py"
SAMPLES = 16


def run_openrlhf(service, tmp_path) -> dict:  # noqa: ANN001
    out = tmp_path / "openrlhf.json"
    return run_driver(
        "openrlhf", "openrlhf_driver.py", service["url"], service["token"], AGENT, out, out=out
    )


def test_openrlhf_experiences_from_the_agent_executor_equal_the_rows(service, tmp_path):
    record = run_openrlhf(service, tmp_path)
    assert record["executor"] == "agent_module.AgentExecutor"  # loaded by OpenRLHF, by path
    assert record["engine_calls"] == 0  # OpenRLHF's vLLM never generated
    samples = record["samples"]
    assert len(samples) == SAMPLES
    # OpenRLHF's order: each prompt's n samples in a row; one episode each.
    tasks = [s["task_id"] for s in samples]
    assert all(tasks[i] == tasks[i - i % 4] for i in range(SAMPLES)) and len(set(tasks)) == 4
    assert len({(s["batch_id"], s["task_id"], s["row"]["sample_index"]) for s in samples}) == 16
    # The calls that arrive together go as one batch: each prompt's samples one group.
    for task in set(tasks):
        group = [s for s in samples if s["task_id"] == task]
        assert sorted(s["row"]["sample_index"] for s in group) == [0, 1, 2, 3]
        assert len({s["batch_id"] for s in group}) == 1
    problems = []
    for s in samples:
        row = s["row"]
        assert s["task_id"] == row["task_id"]
        assert json.loads(s["label"])["task_id"] == row["task_id"]
        sequence = s["sequences"]
        assert sequence == s["observation_tokens"]  # under max_len: nothing cut
        # OpenRLHF's action mask and logprobs start at the second token (token i + 1).
        mask = [0, *s["action_mask"]]
        logprobs = [0.0, *s["rollout_log_probs"]]
        assert len(mask) == len(logprobs) == len(sequence)
        first = mask.index(1)
        problems += check(row, sequence[:first], sequence[first:], mask[first:], logprobs[first:])
        # Aligned with the observation tokens, as the executor's rollout_log_probs.
        problems += check_versions(row, mask[first:], s["token_versions"][first:])
        spans = s["action_ranges"]  # the policy's turns, each [start, end), in order
        assert [int(any(i <= k < j for i, j in spans)) for k in range(len(mask))] == mask
        assert all(i < j for i, j in spans) and spans == sorted(spans)
        assert len(spans) == sum(t["speaker"] == "policy" for t in row["turns"])
        assert s["rewards"] == s["scores"] == [pytest.approx(row["reward"])]
        assert s["info"]["reward"] == [pytest.approx(row["reward"])]
        assert s["info"]["rayrollout/failed"] == [0.0]
        assert s["info"]["rayrollout/num_turns"] == [len(row["turns"])]
        assert s["policy_versions"] == [t["policy_version"] for t in row["turns"]]
        assert s["status"] == row["status"] == "ok"
    assert problems == []
    turns = Counter(len(s["row"]["turns"]) for s in samples)
    assert min(turns) >= 2, turns  # a tool call, then the answer
    longest = max(len(s["sequences"]) for s in samples)
    assert record["batch"]["sequences"] == [SAMPLES, longest]
    assert record["batch"]["action_mask"] == record["batch"]["rollout_log_probs"]
    assert record["batch"]["action_mask"] == [SAMPLES, longest - 1]
    # A failed episode: kept, no action span, flagged; too many failing raise.
    failed = record["failed"]
    assert failed["status"] == ["error"] * 4 and failed["error"] == ["the tool crashed"] * 4
    assert failed["action_ranges"] == [[]] * 4 and failed["mask_sums"] == [0] * 4
    assert min(failed["tokens"]) > 0 and failed["failed_logged"] == [[1.0]] * 4
    assert failed["too_many"].startswith("TooManyFailuresError: 8 of 8 episodes failed")
    assert failed["engine_calls"] == 0
