"""Token bookkeeping and the vLLM deployment config, without vLLM (default tier)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayrollout.agentkit.episode import _check_tokens
from rayrollout.data.schema import Trajectory, Turn
from rayrollout.deployments.vllm.app import llm_config_kwargs, load_vllm_config
from rayrollout.policy.tokens import (
    DeltaRenderer,
    TemplateError,
    first_mismatch,
    parse_hermes_tool_calls,
    tool_call_structural_tag,
)

ROOT = Path(__file__).resolve().parents[2]
IM_START, IM_END = 1000, 1001


def chatml(drift: bool = False):
    """A fake ChatML renderer over character codes, with <|im_start|>/<|im_end|> as one id."""

    async def tokenize(body: dict[str, Any]) -> list[int]:
        messages = body["messages"]
        ids: list[int] = []
        if drift:
            ids += [IM_START, *map(ord, f"system\n{len(messages)}"), IM_END, ord("\n")]
        for m in messages:
            text = m.get("content") or json.dumps(m.get("tool_calls"))
            ids += [IM_START, *map(ord, f"{m['role']}\n{text}"), IM_END, ord("\n")]
        if body["add_generation_prompt"]:
            ids += [IM_START, *map(ord, "assistant\n")]
        return ids

    return tokenize


@pytest.mark.parametrize(
    ("kept", "prompt", "expected"),
    [([1, 2], [1, 2, 3], None), ([1, 2], [1, 2], None), ([1, 2, 3], [1, 2], 2), ([5], [4], 0)],
)
def test_first_mismatch_finds_where_a_prompt_stops_extending_the_kept_ids(kept, prompt, expected):
    assert first_mismatch(kept, prompt) == expected


async def test_delta_appends_only_the_new_messages_after_the_kept_ids():
    render = chatml()
    renderer = DeltaRenderer(render)
    first = [{"role": "user", "content": "hi"}]
    prompt = await renderer.prompt(first, [])
    completion = [*map(ord, "call"), IM_END]  # the model sampled its end-of-turn token
    tool = [{"role": "tool", "content": "42"}]
    delta = await renderer.delta(tool, [], completion)
    whole = await render(
        {
            "messages": [*first, {"role": "assistant", "content": "call"}, *tool],
            "add_generation_prompt": True,
        }
    )
    assert prompt + completion + delta == whole


async def test_a_first_turn_renders_once_for_every_sample_of_its_task():
    render, calls = chatml(), []

    async def counting(body: dict[str, Any]) -> list[int]:
        calls.append(body)
        return await render(body)

    renderer = DeltaRenderer(counting)
    hi, bye = [{"role": "user", "content": "hi"}], [{"role": "user", "content": "bye"}]
    first = await renderer.prompt(hi, [])
    first.append(7)  # the caller's list is its own
    again = await renderer.prompt([{"role": "user", "content": "hi"}], [])
    assert again == await render({"messages": hi, "add_generation_prompt": True})
    assert len(calls) == 1
    assert await renderer.prompt(bye, []) != again and len(calls) == 2
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    await renderer.prompt(hi, [tool])  # other tools: another prompt
    assert len(calls) == 3


async def test_delta_closes_a_truncated_turn_itself():
    renderer = DeltaRenderer(chatml())
    delta = await renderer.delta([{"role": "tool", "content": "1"}], [], [*map(ord, "cut")])
    assert delta[:2] == [IM_END, ord("\n")]


async def test_delta_refuses_a_template_that_rewrites_history():
    with pytest.raises(TemplateError, match="exact token deltas"):
        await DeltaRenderer(chatml(drift=True)).delta([{"role": "tool", "content": "1"}], [], [])


def test_hermes_tool_calls_parse_from_text_and_broken_json_is_kept_for_the_model():
    text = (
        'ok <tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
    )
    content, calls = parse_hermes_tool_calls(text)
    assert content == "ok"
    assert calls[0].function.name == "calculator"
    assert json.loads(calls[0].function.arguments) == {"expression": "1+2"}
    _, broken = parse_hermes_tool_calls('<tool_call>\n{"name": "calculator", "arguments": {"ex')
    assert broken[0].function.name == "calculator"
    assert parse_hermes_tool_calls("plain answer") == ("plain answer", [])


def test_structural_tag_forces_one_call_of_the_offered_tools():
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("a", "b")
    ]
    tag = tool_call_structural_tag(tools)
    assert tag["type"] == "structural_tag"
    assert [e["begin"] for e in tag["format"]["elements"]] == [
        '<tool_call>\n{"name": "a", "arguments": ',
        '<tool_call>\n{"name": "b", "arguments": ',
    ]


def test_episode_records_the_first_token_mismatch_and_counts_every_one():
    trajectory = Trajectory(task_id="t", sample_index=0, group_id="t", environment="math")
    turns = [
        Turn(prompt_token_ids=[1, 2], completion_token_ids=[3]),
        Turn(prompt_token_ids=[1, 2, 3, 4], completion_token_ids=[5]),
        Turn(prompt_token_ids=[1, 9, 3, 4, 5, 6], completion_token_ids=[7]),
        Turn(prompt_token_ids=[1, 9, 3, 4, 5, 6, 0], completion_token_ids=[8]),
    ]
    for turn in turns:  # each extends the one before (as the tool loop's turns do)
        if trajectory.turns:
            _check_tokens(trajectory.metrics, trajectory.turns[-1], turn, len(trajectory.turns))
        trajectory.turns.append(turn)
    assert trajectory.metrics.token_mismatches == 2
    assert (trajectory.metrics.token_mismatch_turn, trajectory.metrics.token_mismatch_index) == (
        2,
        1,
    )
    assert [t.token_mismatch_index for t in turns] == [None, None, 1, 6]


def test_cpu_config_asks_ray_serve_llm_for_cpu_engines_and_small_kv_cache():
    config = load_vllm_config(ROOT / "rayrollout/deployments/vllm/cpu.yaml")
    kwargs = llm_config_kwargs(config, "/models/tiny")
    assert kwargs["accelerator_config"] == {"kind": "cpu"}
    assert kwargs["deployment_config"]["num_replicas"] == 2
    assert kwargs["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert kwargs["engine_kwargs"]["tool_call_parser"] == "hermes"


def test_gpu_config_places_tensor_parallel_workers_on_one_gpu_node():
    config = load_vllm_config(ROOT / "rayrollout/deployments/vllm/gpu.yaml")
    kwargs = llm_config_kwargs(config, config.model_source)
    assert kwargs["accelerator_type"] == "H100"
    assert kwargs["engine_kwargs"]["tensor_parallel_size"] == 2
    assert kwargs["placement_group_config"]["strategy"] == "STRICT_PACK"
    assert all(b["GPU"] == 1 for b in kwargs["placement_group_config"]["bundles"])
    assert "autoscaling_config" in kwargs["deployment_config"]


def test_bad_vllm_config_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model_id: m\nmodel_source: m\nreplicas: 0\n")
    with pytest.raises(ValueError, match=r"bad.yaml: replicas"):
        load_vllm_config(path)


def test_vllm_policy_without_a_deployment_file_says_which_flag_to_pass():
    from rayrollout.auth import RouteAuth
    from rayrollout.data.config import RunConfig
    from rayrollout.engine.startup import PolicyEndpointError, deploy_policy

    with pytest.raises(PolicyEndpointError, match="--policy-config"):
        deploy_policy(RunConfig.model_validate({"policy": {"kind": "vllm"}}), RouteAuth.open())
