"""Episode affinity, and a vLLM replica killed mid-run (CPU, tiny model, 2 replicas).

Both on the tier's shared app (``tiny_vllm``, tests/vllm/conftest.py: ``rayrollout/deployments/vllm/
cpu.yaml``, consistent hashing on ``x-session-id``, vLLM's cached-token counts on):

- Affinity: every later call of a session finds its earlier calls' prefix in vLLM's cache
  (``usage.prompt_tokens_details.cached_tokens``), whole blocks short at most.
- A replica killed: a real ``collect`` in token-ids mode with 32 multi-turn episodes in
  flight; one LLMServer replica's process is SIGKILLed while it runs model calls. Those calls
  fail (Serve's ingress answers 500); the policy client sends each again from the episode's
  kept ids, and the router, having seen the replica die, gives the session to the next
  replica in its ring. Checked on the Parquet output: no episode lost or written twice, no
  token mismatch (each prompt still extends the previous turn's ids: nothing generated
  before was generated again), and every 5xx Serve's proxy answered during the run is
  recorded on a turn (``Turn.retries``, ``Turn.retry_errors``), at least one. It runs after
  every other test of the tier (``kills_a_replica``): the app is left with a replica
  restarting.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import ray
from vllm_tier import ROOT, TinyVllm, client_policy

from rayrollout import CollectResult, RolloutEngine, read_trajectories

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

EPISODES_IN_FLIGHT = 32
REPEATS = 4  # x 9 math tasks: 36 episodes


BLOCK = 128  # vLLM caches whole KV blocks: 128 tokens on CPU unless block_size is set


def llm_replicas(app: str) -> dict[str, Any]:
    """The LLMServer replica actors of ``app`` by name (Serve names them
    ``SERVE_REPLICA::<app>#LLMServer:<model>#<id>``)."""
    return {
        actor["name"]: ray.get_actor(actor["name"], namespace=actor["namespace"])
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(f"SERVE_REPLICA::{app}#LLMServer")
    }


def pid_of(actor: Any) -> int:
    """The process of an actor, asked of the actor itself."""
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (vLLM's engine core and worker processes), from /proc."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    parents[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def proxy_5xx(metrics_port: int, app: str) -> int:
    """5xx answers Serve's HTTP proxy gave on ``app``'s routes (Ray's metrics endpoint)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as page:
        text = page.read().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("ray_serve_num_http_error_requests")
            and f'application="{app}"' in line
            and 'error_code="5' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def settled_proxy_5xx(metrics_port: int, app: str) -> int:
    """``proxy_5xx`` once Ray's export batches have caught up (two reads 3 s apart agree):
    what the app's earlier tests left on the counter."""
    count = proxy_5xx(metrics_port, app)
    for _ in range(20):
        time.sleep(3)
        count, before = proxy_5xx(metrics_port, app), count
        if count == before:
            break
    return count


def test_every_later_call_of_a_session_finds_its_prefix_cached(tiny_vllm: TinyVllm):
    """Consistent hashing sends a session's calls to one replica: each call's prompt (the
    previous prompt + completion + new ids, as in token-ids mode) is cached up to the last
    whole block of what the session sent before. Without affinity about half would miss."""
    import random

    import httpx

    rng = random.Random(0)
    headers = {"Authorization": f"Bearer {tiny_vllm.token}"}
    url = f"{tiny_vllm.base_url}/completions"
    misses = []
    for session in range(8):
        prompt = [rng.randrange(10, 2000) for _ in range(700)]
        sent: list[int] = []
        for call in range(3):
            body = {
                "model": tiny_vllm.model,
                "prompt": prompt,
                "max_tokens": 8,
                "return_token_ids": True,
            }
            answer = httpx.post(
                url, json=body, headers={**headers, "x-session-id": f"s{session}"}, timeout=120
            )
            answer.raise_for_status()
            reply = answer.json()
            cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            if call and cached < len(sent) // BLOCK * BLOCK:
                misses.append((session, call, cached, len(sent)))
            sent = prompt + reply["choices"][0]["token_ids"]
            prompt = sent + [rng.randrange(10, 2000) for _ in range(20)]
    assert not misses, f"(session, call, cached, sent before): {misses}"


def kill_a_replica_mid_run(
    engine: RolloutEngine, app: str, collect: Any, outcome: dict[str, Any]
) -> float:
    """Start ``collect`` on a thread, SIGKILL one of ``app``'s two LLMServer replicas while
    it runs model calls, wait for the collect; returns when the kill happened. Also checks
    that the replica's vLLM processes went with it (Ray reaps a dead worker's children)."""
    replicas = llm_replicas(app)
    assert len(replicas) == 2, replicas
    victim_name, victim_actor = sorted(replicas.items())[0]
    victim = pid_of(victim_actor)
    engine_processes = children(victim)
    assert engine_processes, "the replica's vLLM engine processes were not found"

    collecting = threading.Thread(target=collect, name="collect")
    collecting.start()
    # Calls the replica is running: a call Serve has not handed to it yet is routed again
    # by Serve itself when the replica dies (no error at all), so wait for running ones.
    deadline = time.monotonic() + 300
    in_flight = running = 0
    while in_flight < 16 or running < 4:
        assert collecting.is_alive(), outcome
        assert time.monotonic() < deadline, f"{in_flight} calls in flight, {running} running"
        in_flight = ray.get(engine.engine.stats.remote())["policy_calls"]["in_flight"]
        running = ray.get(victim_actor.get_num_ongoing_requests.remote())
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    print(
        f"\nkilled {victim_name} (pid {victim}) with {in_flight} model calls in flight, "
        f"{running} of them running there"
    )
    collecting.join(timeout=600)
    assert not collecting.is_alive(), "collect did not finish"
    if "error" in outcome:
        raise outcome["error"]
    deadline = time.monotonic() + 60
    while left := [pid for pid in engine_processes if alive(pid)]:
        assert time.monotonic() < deadline, f"vLLM processes of the dead replica left: {left}"
        time.sleep(1)
    return killed_at


@pytest.mark.kills_a_replica
def test_a_replica_killed_mid_run_loses_no_episode_and_records_every_retry(
    tiny_vllm: TinyVllm, metrics_port: int, tmp_path: Path
) -> None:
    rows = [json.loads(line) for line in (ROOT / "rayrollout/environments/math/tasks.jsonl").open()]
    app, out = tiny_vllm.app, tmp_path / "out"
    config = {
        "namespace": "replica-death",
        # As the app's own engine would drive it (cpu.yaml's client block), shorter turns:
        # a tool call cut off at 64 tokens is still a call.
        "policy": client_policy(tiny_vllm, max_tokens=64, last_turn_tool_choice="none"),
        "workers": {"num_workers": 2},
        "episode": {"max_turns": 4},
        "concurrency": EPISODES_IN_FLIGHT,
        "output": {"dir": str(out), "flush_interval_s": 1.0},
        "ray": {"serve_port": tiny_vllm.serve_port},
    }
    answered_before = settled_proxy_5xx(metrics_port, app)
    outcome: dict[str, Any] = {}
    with RolloutEngine(config) as engine:
        engine.start()

        def collect() -> None:
            try:
                outcome["result"] = engine.collect(rows, num_repeats=REPEATS)
            except BaseException as exc:  # raised again on the test's thread
                outcome["error"] = exc

        killed_at = kill_a_replica_mid_run(engine, app, collect, outcome)
    result: CollectResult = outcome["result"]

    trajectories = list(read_trajectories(out))
    keys = [(t.task_id, t.sample_index) for t in trajectories]
    assert len(keys) == len(rows) * REPEATS, result.summary  # none lost...
    assert len(set(keys)) == len(keys)  # ...none written twice
    assert {t.status for t in trajectories} <= {"ok", "truncated", "max_turns"}, [
        t.error for t in trajectories if t.error
    ]
    for t in trajectories:
        assert t.metrics.token_mismatches == 0, (t.task_id, t.metrics)
        for before, after in zip(t.turns, t.turns[1:], strict=False):
            kept = before.prompt_token_ids + before.completion_token_ids
            assert after.prompt_token_ids[: len(kept)] == kept  # nothing generated again
    retried = [turn for t in trajectories for turn in t.turns if turn.retries]
    assert retried, "no model call failed: the replica died with none in flight?"
    for turn in retried:
        assert turn.retries == len(turn.retry_errors)
        assert all(e.startswith(("HTTP 5", "Server", "ClientOSError")) for e in turn.retry_errors)
    recorded_5xx = sum(e.startswith("HTTP 5") for turn in retried for e in turn.retry_errors)
    last_failed_call = max(turn.started_at for turn in retried)
    print(
        f"{len(trajectories)} episodes, {sum(len(t.turns) for t in trajectories)} turns; "
        f"{len(retried)} turns retried ({recorded_5xx} HTTP 5xx tries: "
        f"{sorted({e.split(' (Request ID')[0] for turn in retried for e in turn.retry_errors})}"
        "); the last retried "
        f"call started {last_failed_call - killed_at:+.2f}s from the kill, retried calls took "
        f"{max(turn.seconds for turn in retried):.1f}s at most"
    )
    # Every 5xx Serve's proxy answered on the app's routes during the run is on a turn (Ray
    # exports the proxy's counter in batches: wait for it to count them all).
    deadline = time.monotonic() + 60
    while (answered := proxy_5xx(metrics_port, app) - answered_before) < recorded_5xx:
        assert time.monotonic() < deadline, (answered, recorded_5xx)
        time.sleep(1)
    time.sleep(3)  # one more export batch: a count past ours would be an unrecorded retry
    assert proxy_5xx(metrics_port, app) - answered_before == recorded_5xx
