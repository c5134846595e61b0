"""Scaling: throughput and CPU per episode per role with 1, 2 and 4 worker nodes of a local
multi-node Ray, and the rate at which one engine actor saturates.

The cluster is the cluster tier's (``tests/cluster/raycluster.py``): a head and worker nodes,
each ``ray start --block`` in its own process group with its own ports, ended by PID. Node i
carries the resources ``nodes_K`` for every count K >= i, so a run placed on ``nodes_K``
(``placement.cpu_resource``) has exactly the first K nodes: its worker actors spread across
them, and the engine actor sits on one of them. Episodes are single-tool weather episodes
(2 model calls, 1 tool call, inline environment) against the zero-latency stub policy, so
what is measured is the engine, not a model.

CPU is read from /proc for every process below the run (the driver, the stub, every node's
raylet and workers: ``common.cpu_by_process``) and split per role per episode. The engine
actor's share is its CPU over every engine-side process's (the stub left out); one engine
actor saturates a core at 1 / (its CPU seconds per episode) episodes/s, whatever the number
of workers, nodes or GPUs behind it.

    python benchmarks/scaling.py --runs 3              # full: 5,000 episodes per point
    python benchmarks/scaling.py --smoke               # seconds of work; checks it still works

It needs a quiet machine: Ray gives a node 30 s to register with the head, and on a busy one
a node that misses it stops the run (the nodes' logs are then kept and named).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import (  # noqa: E402
    cpu_by_process,
    cpu_ms_per_episode,
    emit,
    keep_stdout_for_json,
    stub_policy,
    warm_engine,
    weather_tasks,
)
from result_files import run_benchmark  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "cluster"), str(TESTS)]  # raycluster imports tests/netutil
from raycluster import RayTestCluster  # noqa: E402  # the cluster tier's own helper

ROLES = {  # common.cpu_by_process's names -> this benchmark's
    "workers": "workers",
    "engine": "engine actor",
    "driver": "driver",
    "ray daemons and workers": "ray's own",
    "policy stub": "policy stub",
}


def worker_nodes(address: str, mark: str) -> int:
    """How many nodes the live worker actors placed on ``mark`` run on (Ray's state API):
    the check that a point's workers spread over its nodes."""
    from ray.util.state import list_actors

    actors = list_actors(
        address=address,
        filters=[("class_name", "=", "WorkerActor"), ("state", "=", "ALIVE")],
        detail=True,  # required_resources is a detail field
        timeout=60,
    )
    return len({a.node_id for a in actors if mark in (a.required_resources or {})})


def point(engine: Any, roots: list[int], nodes: int, workers: int, episodes: int) -> dict[str, Any]:
    """Collect ``episodes`` on a warm engine; throughput and CPU per episode per role."""
    before = cpu_by_process(roots)
    started = time.perf_counter()
    result = engine.collect(weather_tasks(episodes))
    seconds = time.perf_counter() - started
    after = cpu_by_process(roots)
    ok = result.summary["total"]["statuses"].get("ok", 0)
    if ok != episodes:
        raise RuntimeError(f"only {ok} of {episodes} episodes ok: {result.summary['total']}")
    by_role = {ROLES.get(r, r): ms for r, ms in cpu_ms_per_episode(before, after, episodes).items()}
    engine_side = sum(ms for role, ms in by_role.items() if role != "policy stub")
    engine_ms = by_role.get("engine actor", 0.0)
    return {
        "nodes": nodes,
        "workers": workers,
        "episodes": episodes,
        "seconds": round(seconds, 3),
        "episodes_per_s": round(episodes / seconds, 1),
        "cpu_ms_per_episode": by_role,
        "engine_side_cpu_ms_per_episode": round(engine_side, 3),
        "engine_actor_share": round(engine_ms / engine_side, 3) if engine_side > 0 else None,
        "engine_actor_cores": round(engine_ms * episodes / 1000 / seconds, 3),
        "engine_actor_saturates_at_episodes_per_s": (
            round(1000 / engine_ms) if engine_ms > 0 else None
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2,4", help="worker-node counts, comma-separated")
    parser.add_argument("--workers-per-node", type=int, default=1, help="worker actors per node")
    parser.add_argument("--episodes", type=int, default=5000, help="episodes measured per point")
    parser.add_argument("--warm-up", type=int, default=300, help="episodes before measuring")
    parser.add_argument("--concurrency", type=int, default=256, help="episodes in flight")
    parser.add_argument("--node-cpus", type=int, default=2, help="logical CPUs per worker node")
    parser.add_argument(
        "--temp-dir", default=None, help="folder for the cluster's temp dirs (default: /tmp)"
    )
    parser.add_argument("--smoke", action="store_true", help="200 episodes per point")
    args = parser.parse_args()
    counts = sorted(int(n) for n in args.nodes.split(","))
    if args.smoke:
        args.episodes, args.warm_up, args.concurrency = 200, 50, 32
    keep_stdout_for_json()
    result: dict[str, Any] = {
        "benchmark": "scaling",
        "smoke": args.smoke,
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "workers_per_node": args.workers_per_node,
        "node_cpus": args.node_cpus,
        "cpus": os.cpu_count(),
        "episode": "weather: 2 model calls, 1 tool call, inline; zero-latency stub policy",
        "points": [],
    }
    if args.temp_dir:
        Path(args.temp_dir).mkdir(parents=True, exist_ok=True)
    # Short: Ray's socket paths under it must stay below 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="sc-", dir=args.temp_dir or "/tmp"))
    cluster = RayTestCluster(temp, log_dir=temp / "logs")
    cluster.log_dir.mkdir()
    import ray

    finished = False
    try:
        cluster.start_head(num_cpus=1)
        cluster.wait_for_head()
        for key, value in cluster.env().items():
            if key.startswith("RAY_"):
                os.environ[key] = value
        ray.init(address=cluster.address, namespace="scaling", log_to_driver=False)
        for index in range(1, counts[-1] + 1):  # one at a time: nodes of one host race
            marks = {f"nodes_{k}": 1.0 for k in counts if k >= index}
            cluster.add_node(f"node{index}", num_cpus=args.node_cpus, resources=marks)
            cluster.wait_for_nodes(index + 1)
        roots = [os.getpid(), *(proc.pid for proc in cluster.procs)]
        with stub_policy() as (url, _):
            for nodes in counts:
                workers = nodes * args.workers_per_node
                with warm_engine(
                    url,
                    args.warm_up,
                    namespace=f"scaling-{nodes}",
                    concurrency=args.concurrency,
                    workers={"num_workers": workers},
                    placement={"cpu_resource": f"nodes_{nodes}"},
                ) as engine:
                    measured = point(engine, roots, nodes, workers, args.episodes)
                    measured["worker_nodes"] = worker_nodes(cluster.address, f"nodes_{nodes}")
                result["points"].append(measured)
                print(f"{nodes} node(s): {measured}", file=sys.stderr, flush=True)
        finished = True
    finally:
        ray.shutdown()
        cluster.stop()
        if finished:
            shutil.rmtree(temp, ignore_errors=True)
        else:
            print(f"the nodes' logs are kept in {cluster.log_dir}", file=sys.stderr)
    emit(result)


if __name__ == "__main__":
    run_benchmark(main)
