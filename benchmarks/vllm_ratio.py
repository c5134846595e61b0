"""rayrollout driving vLLM vs vLLM's own serving throughput, same server, same run.

Deploys vLLM on Ray Serve LLM from ``deployments/vllm/cpu.yaml`` (the tiny random-weight
model on CPU), then alternates two clients over the same prompts, sampling and concurrency:

- **vllm**: a bare asyncio client posting ``/v1/completions`` with the prompt ids (vLLM's
  serving throughput with no engine in the way);
- **rayrollout**: ``RolloutEngine.collect`` on single-turn math episodes (token-ids mode,
  ``tool_choice: none``), agents, environment, verifier and Parquet writer included.

Every request generates exactly ``max_tokens`` tokens (``ignore_eos`` and ``min_tokens``),
so generated tokens/s compare directly. Rounds alternate which client goes first. Prints
one JSON object; ``ratio`` = rayrollout / vllm over all rounds (target >= 0.9). Runs in
about 4 minutes on 2 cores (about 2 of them vLLM's start).

    python benchmarks/vllm_ratio.py
    python benchmarks/vllm_ratio.py --episodes 64 --concurrency 16 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit, free_port, keep_stdout_for_json, start_ray, stop_ray  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def math_prompts(n: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (ROOT / "environments/math/tasks.jsonl").open()]
    return [
        {**rows[i % len(rows)], "task_id": f"bench-{i}"} for i in range(n)
    ]  # distinct ids, repeated prompts: the prefix cache helps both clients alike


async def bare_client(
    base_url: str, model: str, prompts: list[list[int]], sampling: dict[str, Any], concurrency: int
) -> tuple[int, float]:
    """vLLM's throughput: POST /v1/completions with prompt ids, ``concurrency`` at once."""
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    generated = 0

    async def one(session: aiohttp.ClientSession, ids: list[int]) -> None:
        nonlocal generated
        async with gate:
            body = {"model": model, "prompt": ids, **sampling}
            async with session.post(f"{base_url}/completions", json=body) as response:
                response.raise_for_status()
                generated += (await response.json())["usage"]["completion_tokens"]

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(one(session, ids) for ids in prompts))
        return generated, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4, help="alternating measurement rounds")
    parser.add_argument("--policy-config", default=str(ROOT / "deployments/vllm/cpu.yaml"))
    args = parser.parse_args()
    keep_stdout_for_json()

    from rayrollout import RolloutEngine, RunConfig
    from rayrollout.services import deploy_policy
    from rayrollout.tokens import chat_template_tokenizer

    start_ray()
    port = free_port()
    began = time.perf_counter()
    run_config = RunConfig.model_validate(
        {
            "namespace": "bench-vllm",
            "concurrency": args.concurrency,
            "policy": {"kind": "vllm", "vllm_config": args.policy_config},
            "ray": {"serve_port": port},
        }
    )
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base_url = deploy_policy(run_config)
    startup_s = time.perf_counter() - began
    policy = run_config.policy
    sampling = {
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "min_tokens": args.max_tokens,  # also past the generation config's extra stop ids
    }
    # The app is up: the engine talks to it as an OpenAI endpoint (no second deploy).
    policy.kind, policy.base_url = "openai", base_url
    policy.tool_choice = "none"
    policy.max_tokens = args.max_tokens
    policy.temperature = 1.0
    policy.extra_body = {"ignore_eos": True, "min_tokens": args.max_tokens}
    run_config.agents.max_turns = 1
    run_config.agents.num_agents = 2
    tasks = math_prompts(args.episodes)

    # The same first-turn prompt ids the engine renders (math tools in the system prompt).
    from environments.math.env import MathEnv

    tokenize = chat_template_tokenizer(policy.tokenizer or policy.model)
    prompt_ids = [
        asyncio.run(
            tokenize(
                {
                    "messages": [{"role": "user", "content": t["prompt"]}],
                    "tools": MathEnv.tool_schemas(),
                    "add_generation_prompt": True,
                }
            )
        )
        for t in tasks
    ]
    bare_sampling = {**sampling, "logprobs": 0, "return_token_ids": True}

    rounds: list[dict[str, float]] = []
    totals: dict[str, tuple[float, float]] = {"vllm": (0, 0.0), "rayrollout": (0, 0.0)}
    with tempfile.TemporaryDirectory() as out:
        run_config.output.dir = out
        with RolloutEngine(run_config) as engine:
            engine.start()
            # Warm-up: both paths once, small.
            asyncio.run(bare_client(base_url, policy.model, prompt_ids[:8], bare_sampling, 8))
            engine.collect(tasks[:8])
            for r in range(args.rounds):
                # Alternate which client goes first: load from elsewhere on the machine
                # then hits both alike, on average.
                order = ("vllm", "rayrollout") if r % 2 == 0 else ("rayrollout", "vllm")
                measured: dict[str, tuple[int, float]] = {}
                for side in order:
                    if side == "vllm":
                        measured[side] = asyncio.run(
                            bare_client(
                                base_url, policy.model, prompt_ids, bare_sampling, args.concurrency
                            )
                        )
                        continue
                    started = time.perf_counter()
                    result = engine.collect(
                        [{**t, "task_id": f"{t['task_id']}-r{r}"} for t in tasks]
                    )
                    seconds = time.perf_counter() - started
                    trajectories = [t for g in result.groups().values() for t in g]
                    failed = [t.error for t in trajectories if t.status == "error"]
                    if failed:
                        raise SystemExit(f"episodes failed: {failed[:3]}")
                    measured[side] = (sum(t.metrics.tokens_out for t in trajectories), seconds)
                vllm_rate = measured["vllm"][0] / measured["vllm"][1]
                ours_rate = measured["rayrollout"][0] / measured["rayrollout"][1]
                rounds.append(
                    {
                        "vllm_tokens_per_s": round(vllm_rate, 1),
                        "rayrollout_tokens_per_s": round(ours_rate, 1),
                        "ratio": round(ours_rate / vllm_rate, 3),
                        "tokens": measured["vllm"][0],
                    }
                )
                for side in totals:
                    tokens, seconds = measured[side]
                    totals[side] = (totals[side][0] + tokens, totals[side][1] + seconds)
    stop_ray()
    vllm = totals["vllm"][0] / totals["vllm"][1]
    ours = totals["rayrollout"][0] / totals["rayrollout"][1]
    ratios = sorted(r["ratio"] for r in rounds)
    emit(
        {
            "benchmark": "vllm_ratio",
            "ratio": round(ours / vllm, 3),  # all rounds' tokens / all rounds' seconds
            "ratio_median_round": ratios[len(ratios) // 2],
            "rayrollout_tokens_per_s": round(ours, 1),
            "vllm_tokens_per_s": round(vllm, 1),
            "rounds": rounds,
            "episodes": args.episodes,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "policy_config": os.path.relpath(args.policy_config, ROOT),
            "startup_s": round(startup_s, 1),
            "device": f"cpu x{os.cpu_count()}",
        }
    )


if __name__ == "__main__":
    main()
