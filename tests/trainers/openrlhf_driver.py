"""Run in OpenRLHF's own venv (``.venv-trainers-openrlhf``): OpenRLHF 0.11.2's path from an
agent file to its ``Experience``, with ``rayrollout/integrations/openrlhf.py`` as the
``--train.agent_func_path`` file, against a running rollout service.

What runs is OpenRLHF's own code: ``vllm_engine._load_agent_executor`` loads the file and
builds its ``AgentExecutor`` as ``RolloutRayActor.__init__`` does, ``RolloutRayActor``'s
``generate_responses`` plays ``n`` samples per prompt (called on a stand-in for the actor,
whose ``generate`` refuses: the executor must not use OpenRLHF's vLLM), each answer goes
through ``SamplesGenerator._process_response_into_experience``, and the experiences through
``Experience.concat_experiences`` (padding), as ``RemoteExperienceMaker.split_rollout_samples``
batches them (that module imports ``openrlhf.models``, hence deepspeed, which the venv
lacks).
``vllm`` is mocked, as OpenRLHF's own tests mock it (no vLLM on CPU here); ``vllm.SamplingParams``
keeps its keyword arguments. Usage: ``python openrlhf_driver.py URL TOKEN AGENT.py OUT.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from types import SimpleNamespace
from unittest.mock import MagicMock

CITIES = ["Paris", "Tokyo", "Oslo", "Lima"]
SAMPLES = 4
MAX_LEN = 1024


class SamplingParams(SimpleNamespace):
    """vLLM's ``SamplingParams`` as far as OpenRLHF's dispatch builds it."""


def mock_vllm() -> None:
    vllm = MagicMock()
    vllm.SamplingParams = SamplingParams
    for name in ("vllm", "vllm.inputs", "vllm.utils"):
        sys.modules[name] = vllm if name == "vllm" else MagicMock()


class Engine:
    """Stands in for ``RolloutRayActor`` (``llm_engine``): OpenRLHF's vLLM, never called."""

    def __init__(self, executor: object) -> None:
        self.executor = executor
        self.calls = 0

    async def generate(self, *args: object, **kwargs: object) -> None:
        self.calls += 1
        raise AssertionError("the executor generated with OpenRLHF's vLLM")


def failed_episodes(vllm_engine, actor, agent_path, params, prompt, label) -> dict:  # noqa: ANN001
    """Episodes whose rows say they failed: each kept, with no action span and flagged; once
    more than half of the episodes played have failed, the executor raises."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    executor = vllm_engine._load_agent_executor(agent_path)
    wait = executor.client.wait

    async def broken(batch_id):  # noqa: ANN001, ANN202
        rows = await wait(batch_id)
        return [r.model_copy(update={"status": "error", "error": "the tool crashed"}) for r in rows]

    executor.client.wait = broken
    engine = Engine(executor)

    async def play() -> list[dict]:
        return await actor.generate_responses(
            engine, prompt, label, params, MAX_LEN, hf_tokenizer=None, num_samples=SAMPLES
        )

    responses = asyncio.run(play())
    generator = SamplesGenerator.__new__(SamplesGenerator)
    experiences = [
        generator._process_response_into_experience(r, max_len=MAX_LEN) for r in responses
    ]
    too_many = None
    try:
        asyncio.run(play())
    except Exception as exc:  # noqa: BLE001 - its name and message go to the test
        too_many = f"{type(exc).__name__}: {exc}"
    return {
        "status": [r["rayrollout_status"] for r in responses],
        "error": [r["rayrollout_error"] for r in responses],
        "action_ranges": [r["action_ranges"] for r in responses],
        "tokens": [len(r["observation_tokens"]) for r in responses],
        "mask_sums": [int(e.action_mask.sum()) for e in experiences],
        "failed_logged": [e.info["rayrollout/failed"].tolist() for e in experiences],
        "rewards": [e.rewards.tolist() for e in experiences],
        "too_many": too_many,
        "engine_calls": engine.calls,
    }


def main(url: str, token: str, agent_path: str, out: str) -> None:
    mock_vllm()
    os.environ["RAYROLLOUT_URL"] = url
    os.environ["RAYROLLOUT_TOKEN"] = token
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray import vllm_engine

    executor = vllm_engine._load_agent_executor(agent_path)
    actor = vllm_engine.RolloutRayActor.__ray_metadata__.modified_class
    engine = Engine(executor)
    # As SamplesGenerator._dispatch_prompts_to_vllm builds them (is_correction_level on).
    params = SamplingParams(
        temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1, logprobs=1
    )
    labels = [
        json.dumps({"task_id": f"weather-{city.lower()}", "environment": "weather"})
        for city in CITIES
    ]
    prompts = [f"What's the weather like in {city}?" for city in CITIES]

    async def play() -> list[list[dict]]:
        return await asyncio.gather(
            *(
                actor.generate_responses(
                    engine, prompt, label, params, MAX_LEN, hf_tokenizer=None, num_samples=SAMPLES
                )
                for prompt, label in zip(prompts, labels, strict=True)
            )
        )

    answers = asyncio.run(play())
    generator = SamplesGenerator.__new__(SamplesGenerator)
    responses = [r for group in answers for r in group]
    experiences = [
        generator._process_response_into_experience(r, max_len=MAX_LEN) for r in responses
    ]
    batch = Experience.concat_experiences(experiences, 0)
    rows = {
        (batch_id, s.task_id, s.sample_index): s.row.model_dump(mode="json")
        for batch_id, s in executor.recent
    }
    samples = []
    for response, experience in zip(responses, experiences, strict=True):
        samples.append(
            {
                "row": rows[
                    (response["rayrollout_batch_id"], response["task_id"], response["sample_index"])
                ],
                "batch_id": response["rayrollout_batch_id"],
                "task_id": response["task_id"],
                "label": experience.labels[0],
                "observation_tokens": response["observation_tokens"],
                "action_ranges": response["action_ranges"],
                "sequences": experience.sequences[0].tolist(),
                "action_mask": experience.action_mask[0].tolist(),
                "rollout_log_probs": experience.rollout_log_probs[0].tolist(),
                "rewards": experience.rewards.tolist(),
                "scores": experience.scores.tolist(),
                "info": {k: v.tolist() for k, v in experience.info.items()},
                "status": response["rayrollout_status"],
                "policy_versions": response["rayrollout_policy_versions"],
                "token_versions": response["rayrollout_token_versions"],
            }
        )
    record = {
        "failed": failed_episodes(vllm_engine, actor, agent_path, params, prompts[0], labels[0]),
        "executor": type(executor).__module__ + "." + type(executor).__name__,
        "engine_calls": engine.calls,
        "samples": samples,
        "batch": {
            "sequences": list(batch.sequences.shape),
            "action_mask": list(batch.action_mask.shape),
            "rollout_log_probs": list(batch.rollout_log_probs.shape),
            "rewards": batch.rewards.tolist(),
        },
    }
    with open(out, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
