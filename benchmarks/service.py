"""The rollout API over HTTP against the engine actor's handle, on one detached engine.

A trainer that joins the Ray cluster calls ``engine.generate`` on the actor; one that cannot
submits the same tasks to the HTTP service (``rayrollout.api.service``) with the light client
and streams the rows back. Both drive the same engine (``start_detached``: what `rayrollout
up` starts) against the stub policy (benchmarks/common.py) at 256 episodes in flight, in
alternating rounds, so the ratio compares like with like. Printed as JSON:

- ``handle`` (``engine.generate``: GRPO groups, answered whole), ``handle_stream`` (the
  engine's ``stream`` through the handle: the rows the service relays, without HTTP) and
  ``http``: episodes/s and CPU milliseconds per episode of every process (the driver with
  its client, Ray's workers, the engine, the workers, the service, the stub), per round and
  their mean; ``ratio`` and ``ratio_to_handle_stream``: HTTP over each, episodes/s (higher
  is better) and CPU per episode (lower is better);
- ``first_row_s``: on the warm service, seconds from a new batch's submit to its first
  streamed row (median and max over several one-task batches);
- ``client_import_s``: a fresh interpreter's ``import rayrollout.client`` (best of three),
  and the heavy modules it loaded (none).

Usage:
    python benchmarks/service.py            # 2 rounds of 2,000 episodes each way
    python benchmarks/service.py --smoke    # tiny sizes; CI checks it still works
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import emit, engine_config, stub_run, tree_cpu_seconds, weather_tasks
from result_files import run_benchmark

ROOT = Path(__file__).resolve().parents[1]


def measure(run: Any, episodes: int, stub_pid: int) -> dict[str, float]:
    """Run ``run()``; episodes/s and CPU ms per episode of the driver's tree and the stub."""
    root = os.getpid()
    cpu0 = tree_cpu_seconds(root) + tree_cpu_seconds(stub_pid)
    start = time.perf_counter()
    done = run()
    wall = time.perf_counter() - start
    cpu = tree_cpu_seconds(root) + tree_cpu_seconds(stub_pid) - cpu0
    if done != episodes:
        raise RuntimeError(f"{done} of {episodes} episodes came back")
    return {
        "episodes_per_s": round(episodes / wall, 1),
        "cpu_ms_per_episode": round(1000 * cpu / episodes, 3),
        "seconds": round(wall, 2),
    }


def client_import() -> dict[str, Any]:
    code = (
        "import sys, time; t = time.perf_counter(); import rayrollout.client; "
        "s = time.perf_counter() - t; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ray', 'pyarrow', 'vllm', 'numpy', 'pandas', 'aiohttp')); print(s, len(heavy))"
    )
    runs = []
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout.split()
        runs.append((float(out[0]), int(out[1])))
    return {"seconds": round(min(s for s, _ in runs), 4), "heavy_modules": runs[0][1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    parser.add_argument("--tasks", type=int, default=500, help="tasks per round")
    parser.add_argument("--n", type=int, default=4, help="samples per task")
    parser.add_argument("--rounds", type=int, default=2, help="rounds each way")
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    if args.smoke:
        args.tasks, args.n, args.rounds = 12, 2, 1
    episodes = args.tasks * args.n

    with stub_run() as (base_url, stub_pid):
        import ray

        from rayrollout import RunConfig
        from rayrollout.api.cluster import down, service_url, start_detached
        from rayrollout.auth import read_token_file
        from rayrollout.client import RolloutClient
        from rayrollout.data.tasks import parse_task_row
        from rayrollout.engine.episode_spec import EpisodeSpec
        from rayrollout.engine.secret_env import route_token_path

        namespace = "bench-service"
        out = tempfile.mkdtemp(prefix="bench-service-")
        config = engine_config(
            base_url,
            out,
            namespace=namespace,
            concurrency=args.concurrency,
            environment="weather",
            service={"port": 0},
        )
        engine = start_detached(RunConfig.model_validate(config))
        try:
            client = RolloutClient(
                service_url(namespace) or "", read_token_file(route_token_path(namespace))
            )
            warm = weather_tasks(max(8, args.concurrency // 4), prefix="warm")
            ray.get(engine.generate.remote(warm, 2))
            client.generate(weather_tasks(len(warm), prefix="warm-http"), 2)

            def by_handle(prefix: str) -> Any:
                tasks = weather_tasks(args.tasks, prefix=prefix)
                return lambda: len(ray.get(engine.generate.remote(tasks, args.n)).trajectories())

            def by_handle_stream(prefix: str) -> Any:
                tasks = [parse_task_row(t) for t in weather_tasks(args.tasks, prefix=prefix)]
                specs = [EpisodeSpec(task, k) for task in tasks for k in range(args.n)]
                return lambda: sum(len(ray.get(ref)) for ref in engine.stream.remote(specs))

            def by_http(prefix: str) -> Any:
                tasks = weather_tasks(args.tasks, prefix=prefix)

                def run() -> int:
                    batch = client.submit(tasks, args.n)
                    return sum(1 for _ in client.stream(batch.batch_id))

                return run

            rounds: dict[str, list[dict[str, float]]] = {
                "handle": [],
                "handle_stream": [],
                "http": [],
            }
            for r in range(args.rounds):
                rounds["handle"].append(measure(by_handle(f"h{r}-"), episodes, stub_pid))
                rounds["handle_stream"].append(
                    measure(by_handle_stream(f"s{r}-"), episodes, stub_pid)
                )
                rounds["http"].append(measure(by_http(f"x{r}-"), episodes, stub_pid))

            first_rows = []
            for i in range(3 if args.smoke else 7):
                start = time.perf_counter()
                batch = client.submit(weather_tasks(1, prefix=f"first{i}-"), 1)
                next(iter(client.stream(batch.batch_id)))
                first_rows.append(time.perf_counter() - start)
                time.sleep(0.2)
        finally:
            down(namespace)

    def mean(way: str, key: str) -> float:
        return round(statistics.fmean(r[key] for r in rounds[way]), 3)

    def ratio(baseline: str) -> dict[str, float | None]:
        # A smoke round lasts a few clock ticks, so its CPU can read 0: no ratio then.
        return {
            k: round(mean("http", k) / mean(baseline, k), 3) if mean(baseline, k) > 0 else None
            for k in _KEYS
        }

    result = {
        "benchmark": "service",
        "episodes_per_round": episodes,
        "tasks": args.tasks,
        "n": args.n,
        "concurrency": args.concurrency,
        "policy": "stub (benchmarks/common.py), weather environment inline",
        "handle": {"rounds": rounds["handle"], **{k: mean("handle", k) for k in _KEYS}},
        "handle_stream": {
            "rounds": rounds["handle_stream"],
            **{k: mean("handle_stream", k) for k in _KEYS},
        },
        "http": {"rounds": rounds["http"], **{k: mean("http", k) for k in _KEYS}},
        "ratio": ratio("handle"),
        "ratio_to_handle_stream": ratio("handle_stream"),
        "first_row_s": {
            "median": round(statistics.median(first_rows), 4),
            "max": round(max(first_rows), 4),
            "runs": len(first_rows),
        },
        "client_import_s": client_import(),
        "cpus": os.cpu_count(),
    }
    emit(result)


_KEYS = ("episodes_per_s", "cpu_ms_per_episode")

if __name__ == "__main__":
    run_benchmark(main)
