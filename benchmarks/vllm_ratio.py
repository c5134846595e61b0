"""rayrollout vs a bare client on one vLLM server; one job: both clients alternate in one run.

rayrollout driving vLLM against a bare async client on the same vLLM server, same run.

Deploys vLLM on Ray Serve LLM from ``rayrollout/deployments/vllm/cpu.yaml`` (the tiny random-weight
model on CPU; ``--replicas`` overrides the file's count), then alternates two clients over
the same prompts, sampling and concurrency:

- **vllm**: a bare asyncio + aiohttp client posting ``/v1/completions`` with the prompt ids
  (the server's throughput with no engine in the way);
- **rayrollout**: ``RolloutEngine.collect`` on single-turn math episodes (token-ids mode,
  ``tool_choice: none``), workers, environment, verifier and Parquet writer included.

Both send the same prompt ids (checked: the engine's first-turn ids must equal the bare
client's), the same sampling (``temperature`` 1.0, ``logprobs`` 0, ``return_token_ids``,
``ignore_eos`` and ``min_tokens = max_tokens``, so every request generates exactly
``max_tokens`` tokens; checked on both sides) and the same number of requests in flight.
Rounds alternate which client goes first. Prints one JSON object: ``ratio`` = rayrollout's
generated tokens/s / the bare client's over all rounds, ``first_round`` apart from the
``steady`` rounds after it, ``ratio_median_round`` and ``ratio_min_round``.

So that a lost ratio names its cause, each side of each round also reports vLLM's own
accounting (``vllm_counters.py``; the deployment exports vLLM's metrics for it): requests,
prompt tokens (computed and cached) per generated token, prefix-cache hit rate, scheduler
steps and tokens per step (the batch), time in vLLM's queue, requests per replica; CPU
seconds by part (Serve's proxy, vLLM's ingress, server, engine core and workers; the
client's driver, workers and engine actor; Ray's daemons) and per generated token;
``ramp_s``, how long the side took to have every slot's first request sent; and
``slot_occupancy``, the share of its slots that held a model call over its wall time.
``work_per_token`` sums each side over the rounds: vLLM's CPU milliseconds per generated
token through the engine over the bare client's is ``vllm_cpu_per_token_ratio``.
docs/vllm-throughput.md says how to read them.

    python benchmarks/vllm_ratio.py          # 96 episodes x 4 rounds: 3-6 min on 2 cores
    python benchmarks/vllm_ratio.py --smoke  # checks it still works: 1.5-3 min (vLLM's start)
    python benchmarks/vllm_ratio.py --noise-floor  # the bare client against itself

``--noise-floor`` runs the bare client on both sides (no engine): its ratios are those of two
identical clients, so the spread of its rounds is how far one round's ratio moves on this
machine for no reason but the machine. Its result is ``results/vllm_ratio_noise_floor.json``,
with ``second_side`` saying what the second side was.

The two clients, the alternating rounds and the summary of their figures are read
together; vLLM's counters and CPU accounting live in ``vllm_counters``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit, free_port, keep_stdout_for_json, start_ray_with_metrics, stop_ray  # noqa: E402
from result_files import run_benchmark  # noqa: E402
from vllm_counters import (  # noqa: E402
    counter_delta,
    cpu_by_part,
    cpu_delta,
    scrape_counters,
    wait_for_counters,
)

ROOT = Path(__file__).resolve().parents[1]
_KEY_ENV = "RAYROLLOUT_BENCH_POLICY_TOKEN"  # where the engine's driver finds the policy key
_AGAIN = "vllm_again"  # the second side of a --noise-floor run: the bare client once more
_WORKERS = 2  # the engine's worker actors


def math_tasks(n: int) -> list[dict[str, Any]]:
    """n single-prompt math tasks: distinct ids, the 9 prompts repeated (the prefix cache
    helps both clients alike)."""
    rows = [json.loads(line) for line in (ROOT / "rayrollout/environments/math/tasks.jsonl").open()]
    return [{**rows[i % len(rows)], "task_id": f"bench-{i}"} for i in range(n)]


async def bare_client(
    base_url: str,
    model: str,
    prompts: list[list[int]],
    sampling: dict[str, Any],
    concurrency: int,
    token: str,
) -> tuple[list[int], float, list[float], float]:
    """POST /v1/completions with prompt ids, ``concurrency`` at once.

    Returns each request's generated tokens (as the server counted them), the seconds, each
    request's start (seconds after the first's), and the requests' summed seconds.
    """
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    starts: list[float] = []
    durations: list[float] = []

    async def one(session: aiohttp.ClientSession, ids: list[int]) -> int:
        async with gate:
            sent = time.perf_counter()
            starts.append(sent - started)
            body = {"model": model, "prompt": ids, **sampling}
            async with session.post(f"{base_url}/completions", json=body) as response:
                response.raise_for_status()
                answer = await response.json()
            durations.append(time.perf_counter() - sent)
            return int(answer["usage"]["completion_tokens"])

    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Authorization": f"Bearer {token}"}  # the policy's routes take the run's token
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, headers=headers
    ) as session:
        started = time.perf_counter()
        generated = await asyncio.gather(*(one(session, ids) for ids in prompts))
        return list(generated), time.perf_counter() - started, starts, sum(durations)


def occupancy(call_seconds: float, seconds: float, concurrency: int) -> float:
    """The share of the side's ``concurrency`` slots that held a model call over its wall
    time: below the other side's, the engine leaves slots empty between episodes."""
    return round(call_seconds / (seconds * concurrency), 3)


def ramp_s(starts: list[float], concurrency: int) -> float:
    """Seconds from a side's first request to the one that fills its last slot: how fast
    the first ``concurrency`` requests reached the server."""
    ordered = sorted(starts)
    return round(ordered[min(concurrency, len(ordered)) - 1] - ordered[0], 3)


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
    metrics_port: int | None = None,
    noise_floor: bool = False,
) -> dict[str, Any]:
    """Measure both clients against a running vLLM app at ``base_url`` (Ray already up),
    whose routes take ``token``. With ``metrics_port`` (Ray's metrics endpoint, the app
    exporting vLLM's metrics) each side also reports vLLM's counters. ``noise_floor`` makes
    the second side the bare client again (``vllm_again``) and starts no engine."""
    from rayrollout import RolloutEngine, RunConfig
    from rayrollout.engine.feeding import chunk_size
    from rayrollout.environments.math.env import MathEnv
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

    async def render(task: dict[str, Any]) -> list[int]:
        messages = [{"role": "user", "content": task["prompt"]}]
        return await tokenize({"messages": messages, "tools": tools, "add_generation_prompt": True})

    prompt_ids = [asyncio.run(render(t)) for t in tasks]
    bare_sampling = {**sampling, "logprobs": 0, "return_token_ids": True}
    root = os.getpid()

    def snapshot() -> dict[str, Any] | None:
        return scrape_counters(metrics_port) if metrics_port else None

    def settled(before: dict[str, Any] | None, requests: int) -> dict[str, Any] | None:
        if before is None or metrics_port is None:
            return None
        return wait_for_counters(metrics_port, before, requests, requests * max_tokens)

    measured_rounds: list[dict[str, Any]] = []
    os.environ[_KEY_ENV] = token  # the engine's workers send it as the policy key
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
                "workers": {"num_workers": _WORKERS},
                "episode": {"max_turns": 1},
                "output": {"dir": out},
                "ray": {"serve_port": serve_port},
            }
        )
        second = _AGAIN if noise_floor else "rayrollout"
        pair = ("vllm", second)
        with nullcontext() if noise_floor else RolloutEngine(run_config) as engine:
            if engine is not None:
                engine.start()
            # Warm-up: both paths once, small, but a batch for every worker: a worker's first
            # episodes load its environment (the math verifier's sympy, a second of CPU in a
            # thread), and a worker the warm-up missed paid it inside the first round.
            warm = min(_WORKERS * chunk_size(concurrency, _WORKERS), episodes)
            counters = snapshot()
            asyncio.run(bare_client(base_url, model, prompt_ids[:warm], bare_sampling, warm, token))
            if engine is not None:
                engine.collect([{**t, "task_id": f"{t['task_id']}-warm"} for t in tasks[:warm]])
            counters = settled(counters, warm if engine is None else 2 * warm)
            for r in range(rounds):
                # Alternate which client goes first: load from elsewhere on the machine
                # then hits both alike, on average.
                order = pair if r % 2 == 0 else pair[::-1]
                sides: dict[str, dict[str, Any]] = {}
                for side in order:
                    cpu_before = cpu_by_part(root)
                    if engine is None or side == "vllm":
                        generated, seconds, starts, call_s = asyncio.run(
                            bare_client(
                                base_url, model, prompt_ids, bare_sampling, concurrency, token
                            )
                        )
                        cpu = cpu_delta(cpu_before, cpu_by_part(root))
                        _check_lengths("bare client", generated, max_tokens)
                        tokens = sum(generated)
                        extra: dict[str, Any] = {}
                    else:  # the engine: episodes, not bare requests
                        started, wall_started = time.perf_counter(), time.time()
                        result = engine.collect(
                            [{**t, "task_id": f"{t['task_id']}-r{r}"} for t in tasks]
                        )
                        seconds = time.perf_counter() - started
                        cpu = cpu_delta(cpu_before, cpu_by_part(root))
                        tokens, starts, call_s, extra = _engine_side(result, prompt_ids, max_tokens)
                        starts = [s - wall_started for s in starts]
                    after = settled(counters, episodes)
                    sides[side] = {
                        "tokens": tokens,
                        "seconds": round(seconds, 2),
                        "tokens_per_s": round(tokens / seconds, 1),
                        "ramp_s": ramp_s(starts, concurrency),
                        "slot_occupancy": occupancy(call_s, seconds, concurrency),
                        "cpu_s": cpu,
                        "vllm_cpu_ms_per_token": round(1000 * cpu["vllm"] / tokens, 3),
                        "client_cpu_ms_per_token": round(1000 * cpu["client"] / tokens, 3),
                        **extra,
                    }
                    if counters is not None and after is not None:
                        sides[side]["vllm_counters"] = counter_delta(counters, after)
                    counters = after
                rates = {side: sides[side]["tokens_per_s"] for side in pair}
                measured_rounds.append(
                    {
                        "first": order[0],
                        "ratio": round(rates[second] / rates["vllm"], 3),
                        "tokens_each": sides["vllm"]["tokens"],
                        **sides,
                    }
                )
    return {"benchmark": "vllm_ratio", "second_side": second, **summarize(measured_rounds, second)}


def _engine_side(
    result: Any, prompt_ids: list[list[int]], max_tokens: int
) -> tuple[int, list[float], float, dict[str, Any]]:
    """The engine's generated tokens, its calls' start times, their summed seconds, and how
    long its model calls spanned of the collect; raises when an episode failed or sent other
    prompt ids."""
    trajectories = [t for g in result.groups().values() for t in g]
    failed = [t.error for t in trajectories if t.status == "error"]
    if failed:
        raise RuntimeError(f"episodes failed: {failed[:3]}")
    sent = sorted(tuple(t.turns[0].prompt_token_ids) for t in trajectories)
    if sent != sorted(map(tuple, prompt_ids)):
        raise RuntimeError("the engine sent other prompt ids than the bare client")
    _check_lengths(
        "rayrollout", [len(t.turns[0].completion_token_ids) for t in trajectories], max_tokens
    )
    calls = [turn for t in trajectories for turn in t.turns]
    span = max(c.started_at + c.seconds for c in calls) - min(c.started_at for c in calls)
    tokens = sum(t.metrics.tokens_out for t in trajectories)
    # Of the collect's wall time, how long its model calls spanned: the rest is the
    # engine's fixed cost per collect (dispatch, flush, summary).
    call_s = sum(c.seconds for c in calls)
    # Where an episode's slot time goes besides its model call: before it (the session's
    # setup, the prompt's rendering) and after it (the verifier, the close).
    before = [t.turns[0].started_at - t.metrics.started_at for t in trajectories]
    after = [
        t.metrics.started_at
        + t.metrics.seconds_total
        - t.turns[-1].started_at
        - t.turns[-1].seconds
        for t in trajectories
    ]
    return (
        tokens,
        [c.started_at for c in calls],
        call_s,
        {
            "calls_span_s": round(span, 2),
            "before_call_ms": round(1000 * statistics.mean(before), 2),
            "after_call_ms": round(1000 * statistics.mean(after), 2),
            "queued_ms": round(
                1000 * statistics.mean(t.metrics.seconds_queued for t in trajectories), 1
            ),
        },
    )


def summarize(rounds: list[dict[str, Any]], second: str = "rayrollout") -> dict[str, Any]:
    """Ratios (``second`` side / bare client) over all rounds, the first round, the steady
    rounds after it; each side's work per generated token summed over the rounds."""
    pair = ("vllm", second)

    def ratio(chosen: list[dict[str, Any]]) -> float | None:
        if not chosen:
            return None
        rate = {
            side: sum(r[side]["tokens"] for r in chosen) / sum(r[side]["seconds"] for r in chosen)
            for side in pair
        }
        return round(rate[second] / rate["vllm"], 3)

    ratios = [r["ratio"] for r in rounds]
    work = {side: work_per_token([r[side] for r in rounds]) for side in pair}
    bare_cpu = work["vllm"]["vllm_cpu_ms_per_token"]
    bare_client = work["vllm"]["client_cpu_ms_per_token"]
    return {
        "ratio": ratio(rounds),  # all rounds' tokens / all rounds' seconds
        "first_round": ratio(rounds[:1]),
        "steady": ratio(rounds[1:]),
        "ratio_median_round": round(statistics.median(ratios), 3),
        "ratio_min_round": min(ratios),
        "ratio_max_round": max(ratios),
        f"{second}_tokens_per_s": round(
            sum(r[second]["tokens"] for r in rounds) / sum(r[second]["seconds"] for r in rounds),
            1,
        ),
        "vllm_tokens_per_s": round(
            sum(r["vllm"]["tokens"] for r in rounds) / sum(r["vllm"]["seconds"] for r in rounds),
            1,
        ),
        "vllm_cpu_per_token_ratio": (
            round(work[second]["vllm_cpu_ms_per_token"] / bare_cpu, 3) if bare_cpu else None
        ),
        # the second side's client CPU (its workers, engine, driver) per token over the bare
        # client's: what the engine side costs beyond a client, on the cores vLLM shares
        "client_cpu_per_token_ratio": (
            round(work[second]["client_cpu_ms_per_token"] / bare_client, 3) if bare_client else None
        ),
        "work_per_token": work,
        "rounds": rounds,
    }


def work_per_token(sides: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's work summed over rounds: CPU per generated token, and vLLM's counters."""
    tokens = sum(s["tokens"] for s in sides)
    cpu = {part: sum(s["cpu_s"][part] for s in sides) for part in sides[0]["cpu_s"]}
    figures: dict[str, Any] = {
        "tokens": tokens,
        "vllm_cpu_ms_per_token": round(1000 * cpu["vllm"] / tokens, 3),
        "client_cpu_ms_per_token": round(1000 * cpu["client"] / tokens, 3),
        "cpu_ms_per_token": {part: round(1000 * s / tokens, 3) for part, s in cpu.items()},
        "slot_occupancy": round(statistics.mean(s["slot_occupancy"] for s in sides), 3),
    }
    counted = [s["vllm_counters"] for s in sides if "vllm_counters" in s]
    if counted:
        total = {key: sum(c[key] for c in counted) for key in _SUMMED}
        figures["vllm_counters"] = {
            "complete": all(c["complete"] for c in counted),
            **total,
            "prompt_per_generated": _per(total["prompt_tokens"], total["generation_tokens"]),
            "computed_prompt_per_generated": _per(
                total["prompt_tokens_computed"], total["generation_tokens"]
            ),
            "prefix_cache_hit_rate": _per(
                total["prefix_cache_hits"], total["prefix_cache_queries"], 4
            ),
            "tokens_per_step": _per(
                total["prompt_tokens_computed"] + total["generation_tokens"], total["steps"]
            ),
        }
    return figures


_SUMMED = (
    "requests",
    "prompt_tokens",
    "prompt_tokens_computed",
    "generation_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "steps",
    "preemptions",
)


def _per(part: float, whole: float, digits: int = 3) -> float | None:
    return round(part / whole, digits) if whole else None


def _check_lengths(side: str, generated: list[int], max_tokens: int) -> None:
    """Every request must generate exactly max_tokens, or tokens/s do not compare."""
    wrong = [n for n in generated if n != max_tokens]
    if wrong:
        raise RuntimeError(f"{side}: {len(wrong)} requests generated {wrong[:5]}, not {max_tokens}")


def deployment_file(path: str, replicas: int | None, folder: str) -> str:
    """The deployment file with vLLM's metrics exported (and ``replicas`` when given)."""
    deployment = yaml.safe_load(Path(path).read_text())
    deployment["engine_metrics"] = True
    if replicas is not None:
        deployment["replicas"] = replicas
    copy = Path(folder) / "vllm.yaml"
    copy.write_text(yaml.safe_dump(deployment))
    return str(copy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4, help="alternating measurement rounds")
    parser.add_argument(
        "--policy-config", default=str(ROOT / "rayrollout/deployments/vllm/cpu.yaml")
    )
    parser.add_argument("--replicas", type=int, help="vLLM replicas (default: the file's)")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny run to check the benchmark works"
    )
    parser.add_argument(
        "--noise-floor",
        action="store_true",
        help="the bare client on both sides, no engine: how far a round's ratio moves on this "
        "machine by itself (results/vllm_ratio_noise_floor.json)",
    )
    args = parser.parse_args()
    keep_stdout_for_json()  # Ray's and vLLM's output to stderr, the JSON alone to stdout
    if args.smoke:
        args.episodes, args.concurrency, args.max_tokens, args.rounds = 16, 8, 16, 2

    from ray import serve

    from rayrollout import RunConfig
    from rayrollout.auth import RouteAuth, new_token
    from rayrollout.engine.startup import deploy_policy

    token = new_token()
    port = free_port()
    metrics_port = start_ray_with_metrics()
    try:
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            run_config = RunConfig.model_validate(
                {
                    "namespace": "bench-vllm",
                    "policy": {
                        "kind": "vllm",
                        "vllm_config": deployment_file(args.policy_config, args.replicas, folder),
                    },
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
            metrics_port=metrics_port,
            noise_floor=args.noise_floor,
        )
    finally:
        stop_ray()
    deployment = yaml.safe_load(Path(args.policy_config).read_text())
    result.update(
        {
            "episodes": args.episodes,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "replicas": args.replicas or deployment.get("replicas", 1),
            "smoke": args.smoke,
            "policy_config": os.path.relpath(args.policy_config, ROOT),
            "startup_s": round(startup_s, 1),
            "device": f"cpu x{os.cpu_count()}",
            "load_average_1m": round(os.getloadavg()[0], 1),
        }
    )
    emit(result, "vllm_ratio_noise_floor" if args.noise_floor else None)


if __name__ == "__main__":
    run_benchmark(main)
