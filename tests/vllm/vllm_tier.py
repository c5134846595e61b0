"""What the vLLM tier's test files share besides fixtures (those are in conftest.py): the
handle of a served model, the math tasks, and a ``collect`` against a served model.

A helper module, not the conftest: a test file imports these by name, and a name imported
from a ``conftest`` module depends on which of the repo's conftest files was loaded last.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayrollout import RolloutEngine, Trajectory

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "RAYROLLOUT_VLLM_TIER_TOKEN"  # where a test's engine finds the served model's token


@dataclass
class VllmPolicy:
    """A model served by vLLM on Ray Serve LLM, deployed through rayrollout (kind 'vllm')."""

    base_url: str
    model: str
    model_path: Path
    serve_port: int
    startup_s: float
    token: str  # what its routes take (rayrollout.auth)
    app: str  # its Serve application

    def completions(self, **body: Any) -> dict[str, Any]:
        """``POST /v1/completions`` of the served model with ``body``: its first choice."""
        import httpx

        response = httpx.post(
            f"{self.base_url}/completions",
            json={"model": self.model, "temperature": 0.0, **body},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=120,
        )
        response.raise_for_status()
        choice: dict[str, Any] = response.json()["choices"][0]
        return choice

    def prompt_logprobs(self, ids: list[int], tries: int) -> list[list[float]]:
        """The served model's logprob of each of ``ids`` after the first, from ``tries``
        requests (any replica may answer one)."""
        answers = []
        for _ in range(tries):
            scored = self.completions(prompt=ids, max_tokens=1, prompt_logprobs=0)
            answers.append(
                [next(iter(d.values()))["logprob"] for d in scored["prompt_logprobs"][1:]]
            )
        return answers


def deploy_vllm(
    namespace: str, deployment_file: Path, model_path: Path, serve_port: int
) -> tuple[VllmPolicy, Any]:
    """Deploy the vLLM app of ``deployment_file`` under ``namespace`` through rayrollout's
    'vllm' policy kind: its handle, and the run config it deployed from (which the kind
    completes, e.g. its tokenizer). The caller deletes the app (``policy_app_name``)."""
    from rayrollout.auth import RouteAuth, new_token
    from rayrollout.data.config import RunConfig
    from rayrollout.engine.startup import deploy_policy, policy_app_name

    config = RunConfig.model_validate(
        {
            "namespace": namespace,
            "policy": {"kind": "vllm", "vllm_config": str(deployment_file)},
            "ray": {"serve_port": serve_port},
        }
    )
    token = new_token()
    started = time.perf_counter()
    base_url = deploy_policy(config, RouteAuth.bearer(token))
    policy = VllmPolicy(
        base_url=base_url,
        model=config.policy.model,
        model_path=model_path,
        serve_port=serve_port,
        startup_s=time.perf_counter() - started,
        token=token,
        app=policy_app_name(namespace),
    )
    return policy, config


def gap(a: list[float], b: list[float]) -> float:
    """The mean absolute difference of two logprob lists of one length."""
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


@dataclass
class TinyVllm(VllmPolicy):
    """The tier's shared app of the tiny model, and the engine that deployed it."""

    engine: RolloutEngine  # examples/grpo_loop.py's engine (its policy kind 'vllm')
    work_dir: Path  # where that engine writes, and checkpoints go


def math_tasks(strict_tools: bool = False) -> list[dict[str, Any]]:
    """The math environment's 9 tasks (with ``strict_tools``: tool schemas vLLM enforces)."""
    rows = [json.loads(line) for line in (ROOT / "rayrollout/environments/math/tasks.jsonl").open()]
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


def client_policy(policy: VllmPolicy, **settings: Any) -> dict[str, Any]:
    """The ``policy`` block of an engine that drives ``policy`` as an external server (kind
    'openai') in token-ids mode, as kind 'vllm' drives its own; ``settings`` override. Sets
    ``KEY_ENV`` to the policy's token: the engine started next sends it."""
    os.environ[KEY_ENV] = policy.token
    return {
        "kind": "openai",
        "base_url": policy.base_url,
        "api_key_env": KEY_ENV,
        "model": policy.model,
        "tokenizer": str(policy.model_path),
        "prompt_mode": "token_ids",
        "return_token_ids": True,
        "tool_choice": "required",
        # Short turns keep the tier fast; a tool call cut off here is still parsed
        # (the tool answers it with an error) and its turn closed exactly.
        "max_tokens": 128,
        "temperature": 1.0,
        "timeout_s": 120,
        # Each constrained turn's rescoring prefill (prompt_logprobs over the whole sequence,
        # no prefix cache) about doubles a turn's time on CPU; test_model_logprobs_vllm turns
        # it on and checks it, the other tests check the tokens.
        "model_logprobs": "off",
        **settings,
    }


def run(
    policy: VllmPolicy, tmp_path: Path, tasks: list[dict], repeats: int, **settings: Any
) -> list[Trajectory]:
    """``tasks`` x ``repeats`` episodes (3 turns at most) on ``policy``, through a
    ``RolloutEngine`` of its own; ``settings`` override the policy block's."""
    config = {
        "namespace": "vllm-tests",
        "concurrency": 16,
        "policy": client_policy(policy, **settings),
        "workers": {"num_workers": 2},
        "episode": {"max_turns": 3},
        "output": {"dir": str(tmp_path / "out"), "flush_interval_s": 1.0},
        "ray": {"serve_port": policy.serve_port},
    }
    with RolloutEngine(config) as engine:
        result = engine.collect(tasks, num_repeats=repeats)
    return [t for group in result.groups().values() for t in group]
