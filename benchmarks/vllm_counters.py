"""vLLM's own accounting of a measured stretch: its Prometheus counters and its processes' CPU.

A throughput ratio says that a client lost speed, not why. vLLM counts what it was asked to
do and how it did it: prompt tokens (computed or found in the prefix cache), generated
tokens, requests, scheduler steps and the tokens each step carried (the batch), time in its
waiting queue. Read before and after each side of a measurement, those counters name the
cause of a regression: more prefill per generated token, prefix-cache misses, smaller
batches (more steps for the same tokens), requests queued or trickling in.

The counters come through Ray's metrics endpoint (a deployment with ``engine_metrics: true``
exports them as ``ray_vllm_*``, one series per replica); Ray exports in batches, so a
snapshot after a stretch waits until the counts cover what the stretch sent. CPU seconds come
from ``/proc``, split by the part of the vLLM app a process belongs to.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from typing import Any

__all__ = [
    "counter_delta",
    "cpu_by_part",
    "cpu_delta",
    "scrape_counters",
    "wait_for_counters",
]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Ray's names for vLLM's counters (vllm:prompt_tokens -> ray_vllm_prompt_tokens_total).
_COUNTERS = {
    "requests": "ray_vllm_request_success_total",
    "prompt_tokens": "ray_vllm_prompt_tokens_total",
    "generation_tokens": "ray_vllm_generation_tokens_total",
    "prefix_cache_queries": "ray_vllm_prefix_cache_queries_total",
    "prefix_cache_hits": "ray_vllm_prefix_cache_hits_total",
    "preemptions": "ray_vllm_num_preemptions_total",
}
# Histograms, read as sum and count: tokens per scheduler step (its count is the steps),
# seconds in the waiting queue, to the first token, whole request. Ray's metrics agent
# re-records each observation at its bucket's midpoint, so the sums (and the means below)
# are approximate: a mean queue time of 0.15 s says every request waited under 0.3 s, the
# first bucket.
_HISTOGRAMS = {
    "step_tokens": "ray_vllm_iteration_tokens_total",
    "queue_s": "ray_vllm_request_queue_time_seconds",
    "prefill_s": "ray_vllm_request_prefill_time_seconds",
    "first_token_s": "ray_vllm_time_to_first_token_seconds",
    "request_s": "ray_vllm_e2e_request_latency_seconds",
}
_BY_SOURCE = "ray_vllm_prompt_tokens_by_source_total"
_REPLICA = re.compile(r'ReplicaId="([^"]*)"')
_SOURCE = re.compile(r'source="([^"]*)"')


def scrape_counters(port: int) -> dict[str, Any]:
    """vLLM's counters now, summed over every replica Ray's metrics endpoint reports, and
    finished requests per replica (``per_replica``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    names = {metric: key for key, metric in _COUNTERS.items()}
    for key, metric in _HISTOGRAMS.items():
        names[f"{metric}_sum"] = f"{key}_sum"
        names[f"{metric}_count"] = f"{key}_count"
    totals: dict[str, float] = {}
    per_replica: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("ray_vllm_"):
            continue
        name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
        if name == _BY_SOURCE:
            source = _SOURCE.search(line)
            key = f"prompt_tokens_{source.group(1) if source else 'unknown'}"
        elif name in names:
            key = names[name]
        else:
            continue
        totals[key] = totals.get(key, 0.0) + value
        if key == "requests":
            replica = _REPLICA.search(line)
            replica_id = replica.group(1) if replica else "?"
            per_replica[replica_id] = per_replica.get(replica_id, 0.0) + value
    return {"totals": totals, "per_replica": per_replica}


def wait_for_counters(
    port: int, before: dict[str, Any], requests: int, generated: int, timeout_s: float = 120
) -> dict[str, Any]:
    """A snapshot once the counters count ``requests`` more finished requests and
    ``generated`` more tokens than ``before`` (Ray exports in batches); after ``timeout_s``,
    what they count then, marked ``complete: False`` (a heavily loaded machine delays Ray's
    export: the next stretch's counts then include the rest)."""
    want_requests = before["totals"].get("requests", 0.0) + requests
    want_tokens = before["totals"].get("generation_tokens", 0.0) + generated
    deadline = time.monotonic() + timeout_s
    while True:
        now = scrape_counters(port)
        totals = now["totals"]
        done = (
            totals.get("requests", 0.0) >= want_requests
            and totals.get("generation_tokens", 0.0) >= want_tokens
        )
        if done or time.monotonic() > deadline:
            return {**now, "complete": done}
        time.sleep(0.5)


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What vLLM counted between two snapshots, with the figures per generated token."""
    counted = {k: v - before["totals"].get(k, 0.0) for k, v in after["totals"].items()}
    generated = counted.get("generation_tokens", 0.0)
    prompt = counted.get("prompt_tokens", 0.0)
    computed = counted.get("prompt_tokens_local_compute", 0.0)
    queries, hits = counted.get("prefix_cache_queries", 0.0), counted.get("prefix_cache_hits", 0.0)
    steps = counted.get("step_tokens_count", 0.0)
    requests = counted.get("requests", 0.0)

    def mean(key: str) -> float | None:
        count = counted.get(f"{key}_count", 0.0)
        return round(counted.get(f"{key}_sum", 0.0) / count, 4) if count else None

    return {
        "complete": after.get("complete", True),
        "requests": int(requests),
        "prompt_tokens": int(prompt),
        "prompt_tokens_computed": int(computed),
        "generation_tokens": int(generated),
        "prompt_per_generated": round(prompt / generated, 3) if generated else None,
        "computed_prompt_per_generated": round(computed / generated, 3) if generated else None,
        "prefix_cache_queries": int(queries),
        "prefix_cache_hits": int(hits),
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
        "steps": int(steps),
        "tokens_per_step": round((computed + generated) / steps, 2) if steps else None,
        "preemptions": int(counted.get("preemptions", 0.0)),
        "mean_queue_s": mean("queue_s"),
        "mean_prefill_s": mean("prefill_s"),
        "mean_first_token_s": mean("first_token_s"),
        "mean_request_s": mean("request_s"),
        "requests_per_replica": sorted(
            int(v - before["per_replica"].get(r, 0.0)) for r, v in after["per_replica"].items()
        ),
    }


# The vLLM app's processes by a part of their command line: Serve's replica actors, and
# vLLM's own processes that a replica starts (its engine core and model workers).
_PARTS = (
    ("ray::ProxyActor", "proxy"),
    ("OpenAiIngress", "ingress"),
    ("DevIngress", "ingress"),
    ("LLMServer", "server"),
    ("EngineCore", "engine_core"),
    ("Worker", "worker"),
)


def cpu_by_part(root: int) -> dict[str, float]:
    """CPU seconds used so far by ``root``'s process tree, by part.

    Serving vLLM: ``proxy`` (Serve's HTTP proxy, where every request enters), ``ingress``
    (the OpenAI ingress replica), ``server`` (the LLMServer replicas: vLLM's front end,
    which takes requests, detokenizes and answers), ``engine_core`` (vLLM's scheduler),
    ``worker`` (its model runner). The client: ``driver`` (this process, where the bare
    client runs), ``workers``, ``engine`` (the engine actor) and ``other_actors`` (any other
    actor: environment replicas, for one). ``ray``: Ray's and Serve's own processes (GCS,
    raylet, Serve's controller, the dashboard agent that exports metrics, idle workers). A
    process takes the part of its nearest ancestor (itself included) whose command line
    names one. Also the whole machine's figures (``machine_cpu``), for ``cpu_delta``'s
    ``outside`` and ``steal``.
    """
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
                names[pid] = file.read(300).replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parents[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    parts = dict.fromkeys(VLLM_PARTS + CLIENT_PARTS + ("ray",), 0.0)
    for pid, seconds in cpu.items():
        part, node = None, pid
        while node and node != root:
            if part is None:
                part = _part_of(names.get(node, ""))
            node = parents.get(node, 0)
        if node == root:
            parts[part or ("driver" if pid == root else "ray")] += seconds
    return {**parts, **machine_cpu()}


def machine_cpu() -> dict[str, float]:
    """The machine's busy CPU seconds so far (all processes, the kernel's included) and the
    seconds its hypervisor gave to other guests (``steal``), from ``/proc/stat``."""
    with open("/proc/stat") as file:
        ticks = [int(t) for t in file.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
    return {
        "machine_busy": (user + nice + system + irq + softirq) / _CLOCK_TICKS,
        "steal": steal / _CLOCK_TICKS,
    }


VLLM_PARTS = ("proxy", "ingress", "server", "engine_core", "worker")
_RAY_DAEMONS = (
    "ray::ServeController",
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
    "ray::TelemetryAgent",
    "ray::IDLE",
)
CLIENT_PARTS = ("driver", "workers", "engine", "other_actors")


def _part_of(command: str) -> str | None:
    """The part a process's command line names, None when it names none."""
    for needle, part in _PARTS:
        if needle in command and (part not in ("engine_core", "worker") or "VLLM" in command):
            return part
    if command.startswith(_RAY_DAEMONS):
        return "ray"
    if command.startswith("ray::WorkerActor"):
        return "workers"
    if command.startswith("ray::EngineActor"):
        return "engine"
    if command.startswith("ray::"):
        return "other_actors"
    return None


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per part between two ``cpu_by_part`` snapshots, with vLLM's parts summed
    as ``vllm`` and the client's as ``client``; ``outside``: the machine's busy CPU that no
    live process of the tree used (other work on the machine, processes that ended), and
    ``steal``: time the hypervisor ran other guests. Either large in one round says the
    machine, not a client, slowed it."""
    delta = {part: round(after[part] - before[part], 2) for part in after}
    busy = delta.pop("machine_busy")
    delta["vllm"] = round(sum(delta[p] for p in VLLM_PARTS), 2)
    delta["client"] = round(sum(delta[p] for p in CLIENT_PARTS), 2)
    tree = delta["vllm"] + delta["client"] + delta["ray"]
    delta["outside"] = round(max(0.0, busy - tree), 2)
    return delta
