"""rayrollout driving vLLM vs a bare async client against the same vLLM server, same run.

Deploys vLLM on Ray Serve LLM from ``deployments/vllm/cpu.yaml`` (the tiny random-weight
model on CPU), then alternates two clients over the same prompts, sampling and concurrency:

- **vllm**: a bare asyncio + aiohttp client posting ``/v1/completions`` with the prompt ids
  (the server's throughput with no engine in the way);
- **rayrollout**: ``RolloutEngine.collect`` on single-turn math episodes (token-ids mode,
  ``tool_choice: none``), agents, environment, verifier and Parquet writer included.

Both send the same prompt ids (checked: the engine's first-turn ids must equal the bare
client's), the same sampling (``temperature`` 1.0, ``logprobs`` 0, ``return_token_ids``,
``ignore_eos`` and ``min_tokens = max_tokens``, so every request generates exactly
``max_tokens`` tokens; checked on both sides) and the same number of requests in flight.
Rounds alternate which client goes first. Prints one JSON object; ``ratio`` = rayrollout's
generated tokens/s / the bare client's, over all rounds (target >= 0.9).

    python benchmarks/vllm_ratio.py          # 96 episodes x 4 rounds: 2-5 min on 2 cores
    python benchmarks/vllm_ratio.py --smoke  # checks it still works: 1.5-3 min (vLLM's start)

Each round also reports each side's CPU seconds by role (``cpu_s``: vLLM's processes, the
client's, Ray's daemons) and how much of the engine's wall time its model calls spanned.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import CLOCK_TICKS, emit, free_port, keep_stdout_for_json, start_ray, stop_ray  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_KEY_ENV = "RAYROLLOUT_BENCH_POLICY_TOKEN"  # where the engine's driver finds the policy key


def math_tasks(n: int) -> list[dict[str, Any]]:
    """n single-prompt math tasks: distinct ids, the 9 prompts repeated (the prefix cache
    helps both clients alike)."""
    rows = [json.loads(line) for line in (ROOT / "environments/math/tasks.jsonl").open()]
    return [{**rows[i % len(rows)], "task_id": f"bench-{i}"} for i in range(n)]


async def bare_client(
    base_url: str,
    model: str,
    prompts: list[list[int]],
    sampling: dict[str, Any],
    concurrency: int,
    token: str,
) -> tuple[list[int], float]:
    """POST /v1/completions with prompt ids, ``concurrency`` at once.

    Returns each request's generated tokens (as the server counted them) and the seconds.
    """
    import aiohttp

    gate = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession, ids: list[int]) -> int:
        async with gate:
            body = {"model": model, "prompt": ids, **sampling}
            async with session.post(f"{base_url}/completions", json=body) as response:
                response.raise_for_status()
                answer = await response.json()
                return int(answer["usage"]["completion_tokens"])

    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Authorization": f"Bearer {token}"}  # the policy's routes take the run's token
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, headers=headers
    ) as session:
        started = time.perf_counter()
        generated = await asyncio.gather(*(one(session, ids) for ids in prompts))
        return list(generated), time.perf_counter() - started


def run_rounds(
    base_url: str,
    model: str,
    tokenizer: str,
    *,
    episodes: int,
    concurrency: int,
    max_tokens: int,
    rounds: int,
    serve_port: int,
    token: str,
    namespace: str = "bench-vllm",
) -> dict[str, Any]:
    """Measure both clients against a running vLLM app at ``base_url`` (Ray already up),
    whose routes take ``token``."""
    from rayrollout.environments.math.env import MathEnv

    from rayrollout import RolloutEngine, RunConfig
    from rayrollout.policy.tokens import chat_template_tokenizer

    sampling = {
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "min_tokens": max_tokens,  # also past the generation config's extra stop ids
    }
    tasks = math_tasks(episodes)
    # The first-turn prompt ids the engine renders: the user prompt, the math tools.
    tokenize = chat_template_tokenizer(tokenizer)
    tools = MathEnv.tool_schemas()
    prompt_ids = [
        asyncio.run(
            tokenize(
                {
                    "messages": [{"role": "user", "content": t["prompt"]}],
                    "tools": tools,
                    "add_generation_prompt": True,
                }
            )
        )
        for t in tasks
    ]
    bare_sampling = {**sampling, "logprobs": 0, "return_token_ids": True}

    measured_rounds: list[dict[str, Any]] = []
    totals = {"vllm": [0, 0.0], "rayrollout": [0, 0.0]}
    os.environ[_KEY_ENV] = token  # the engine's agents send it as the policy key
    with tempfile.TemporaryDirectory() as out:
        run_config = RunConfig.model_validate(
            {
                "namespace": namespace,
                "concurrency": concurrency,
                "policy": {
                    "kind": "openai",
                    "base_url": base_url,
                    "api_key_env": _KEY_ENV,
                    "model": model,
                    "tokenizer": tokenizer,
                    "prompt_mode": "token_ids",
                    "return_token_ids": True,
                    "tool_choice": "none",
                    "max_tokens": max_tokens,
                    "temperature": 1.0,
                    "timeout_s": 600,
                    "extra_body": {"ignore_eos": True, "min_tokens": max_tokens},
                },
                "agents": {"num_agents": 2, "max_turns": 1},
                "output": {"dir": out},
                "ray": {"serve_port": serve_port},
            }
        )
        with RolloutEngine(run_config) as engine:
            engine.start()
            # Warm-up: both paths once, small.
            warm = min(8, episodes)
            asyncio.run(bare_client(base_url, model, prompt_ids[:warm], bare_sampling, warm, token))
            engine.collect([{**t, "task_id": f"{t['task_id']}-warm"} for t in tasks[:warm]])
            for r in range(rounds):
                # Alternate which client goes first: load from elsewhere on the machine
                # then hits both alike, on average.
                order = ("vllm", "rayrollout") if r % 2 == 0 else ("rayrollout", "vllm")
                measured: dict[str, tuple[int, float]] = {}
                cpu: dict[str, dict[str, float]] = {}
                for side in order:
                    cpu_before = cpu_seconds_by_role(os.getpid())
                    if side == "vllm":
                        generated, seconds = asyncio.run(
                            bare_client(
                                base_url, model, prompt_ids, bare_sampling, concurrency, token
                            )
                        )
                        _check_lengths("bare client", generated, max_tokens)
                        measured[side] = (sum(generated), seconds)
                        cpu[side] = _cpu_delta(cpu_before, cpu_seconds_by_role(os.getpid()))
                        continue
                    started = time.perf_counter()
                    result = engine.collect(
                        [{**t, "task_id": f"{t['task_id']}-r{r}"} for t in tasks]
                    )
                    seconds = time.perf_counter() - started
                    cpu[side] = _cpu_delta(cpu_before, cpu_seconds_by_role(os.getpid()))
                    trajectories = [t for g in result.groups().values() for t in g]
                    failed = [t.error for t in trajectories if t.status == "error"]
                    if failed:
                        raise RuntimeError(f"episodes failed: {failed[:3]}")
                    sent = sorted(tuple(t.turns[0].prompt_token_ids) for t in trajectories)
                    if sent != sorted(map(tuple, prompt_ids)):
                        raise RuntimeError("the engine sent other prompt ids than the bare client")
                    generated = [len(t.turns[0].completion_token_ids) for t in trajectories]
                    _check_lengths("rayrollout", generated, max_tokens)
                    measured[side] = (sum(t.metrics.tokens_out for t in trajectories), seconds)
                    # Of the collect's wall time, how long its model calls spanned: the rest
                    # is the engine's fixed cost per collect (dispatch, flush, summary).
                    calls = [turn for t in trajectories for turn in t.turns]
                    span = max(c.started_at + c.seconds for c in calls) - min(
                        c.started_at for c in calls
                    )
                rates = {side: tokens / seconds for side, (tokens, seconds) in measured.items()}
                measured_rounds.append(
                    {
                        "first": order[0],
                        "vllm_tokens_per_s": round(rates["vllm"], 1),
                        "rayrollout_tokens_per_s": round(rates["rayrollout"], 1),
                        "ratio": round(rates["rayrollout"] / rates["vllm"], 3),
                        "tokens_each": measured["vllm"][0],
                        "vllm_s": round(measured["vllm"][1], 2),
                        "rayrollout_s": round(measured["rayrollout"][1], 2),
                        "rayrollout_calls_span_s": round(span, 2),
                        "cpu_s": cpu,
                    }
                )
                for side, (tokens, seconds) in measured.items():
                    totals[side][0] += tokens
                    totals[side][1] += seconds
    vllm = totals["vllm"][0] / totals["vllm"][1]
    ours = totals["rayrollout"][0] / totals["rayrollout"][1]
    ratios = sorted(r["ratio"] for r in measured_rounds)
    return {
        "benchmark": "vllm_ratio",
        "ratio": round(ours / vllm, 3),  # all rounds' tokens / all rounds' seconds
        "ratio_median_round": ratios[len(ratios) // 2],
        "rayrollout_tokens_per_s": round(ours, 1),
        "vllm_tokens_per_s": round(vllm, 1),
        "rounds": measured_rounds,
        "episodes": episodes,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
    }


def cpu_seconds_by_role(root: int) -> dict[str, float]:
    """CPU seconds used so far by this process's tree, by role: 'vllm' (the policy app's
    replicas, ingress and their engine processes), 'client' (this driver, where the bare client
    runs, and the engine's actors: agents, engine, environments) and 'ray' (Ray's and Serve's
    own daemons). On a 2-core machine the client's CPU is taken from vLLM's."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                names[pid] = file.read(200).split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        parents[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    roles = {"vllm": 0.0, "client": 0.0, "ray": 0.0}
    for pid, seconds in cpu.items():
        role, node = None, pid
        while node and node != root:
            name = names.get(node, "")
            if role is None and name.startswith("ray::"):
                policy = ".policy:" in name
                daemon = name.startswith(("ray::ServeController", "ray::ProxyActor"))
                role = "vllm" if policy else ("ray" if daemon else "client")
            node = parents.get(node, 0)
        if node == root:
            roles[role or ("client" if pid == root else "ray")] += seconds
    return roles


def _cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {role: round(after[role] - before[role], 2) for role in after}


def _check_lengths(side: str, generated: list[int], max_tokens: int) -> None:
    """Every request must generate exactly max_tokens, or tokens/s do not compare."""
    wrong = [n for n in generated if n != max_tokens]
    if wrong:
        raise RuntimeError(f"{side}: {len(wrong)} requests generated {wrong[:5]}, not {max_tokens}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4, help="alternating measurement rounds")
    parser.add_argument("--policy-config", default=str(ROOT / "deployments/vllm/cpu.yaml"))
    parser.add_argument(
        "--smoke", action="store_true", help="tiny run to check the benchmark works"
    )
    args = parser.parse_args()
    keep_stdout_for_json()  # Ray's and vLLM's output to stderr, the JSON alone to stdout
    if args.smoke:
        args.episodes, args.concurrency, args.max_tokens, args.rounds = 16, 8, 16, 2

    from ray import serve

    from rayrollout import RunConfig
    from rayrollout.auth import RouteAuth, new_token
    from rayrollout.engine.services import deploy_policy

    token = new_token()
    start_ray()
    try:
        port = free_port()
        began = time.perf_counter()
        run_config = RunConfig.model_validate(
            {
                "namespace": "bench-vllm",
                "policy": {"kind": "vllm", "vllm_config": args.policy_config},
                "ray": {"serve_port": port},
            }
        )
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # fills policy.model and policy.tokenizer
        base_url = deploy_policy(run_config, RouteAuth.bearer(token))
        startup_s = time.perf_counter() - began
        policy = run_config.policy
        result = run_rounds(
            base_url,
            policy.model,
            policy.tokenizer or policy.model,
            episodes=args.episodes,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            rounds=args.rounds,
            serve_port=port,
            token=token,
        )
    finally:
        stop_ray()
    result.update(
        {
            "smoke": args.smoke,
            "policy_config": os.path.relpath(args.policy_config, ROOT),
            "startup_s": round(startup_s, 1),
            "device": f"cpu x{os.cpu_count()}",
            "load_average_1m": round(os.getloadavg()[0], 1),
        }
    )
    emit(result)


if __name__ == "__main__":
    main()
