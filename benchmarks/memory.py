"""Memory: RSS of the driver, the engine and the workers while 100k trajectories are written.

Rows stream to Parquet parts and the engine keeps only counters and a bounded sample, so RSS
should stay flat however many episodes run. Sampled every second from /proc; reported per
process kind as start (after warm-up), peak and end, in MB.

    python benchmarks/memory.py                  # 100,000 episodes
    python benchmarks/memory.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit, stub_run, warm_engine, weather_tasks  # noqa: E402
from result_files import run_benchmark  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def actor_pids(namespace: str) -> dict[str, int]:
    import ray

    pids = {}
    for name in ("engine", "worker:0", "worker:1"):
        actor = ray.get_actor(name, namespace=namespace)
        pids[name] = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    return pids


def task_stream(n: int) -> Iterator[dict[str, Any]]:
    for chunk_start in range(0, n, 1000):
        yield from weather_tasks(min(1000, n - chunk_start), prefix=f"m{chunk_start}-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.episodes = 500
    samples: dict[str, list[float]] = {}
    with stub_run() as (url, _stub_pid), warm_engine(url, 500, namespace="memory") as engine:
        pids = {"driver": os.getpid(), **actor_pids("memory")}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for name, pid in pids.items():
                    samples.setdefault(name, []).append(rss_mb(pid))
                done.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        result = engine.collect(task_stream(args.episodes))
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
        for name, pid in pids.items():
            samples[name].append(rss_mb(pid))
    report: dict[str, Any] = {
        "benchmark": "memory",
        "episodes": args.episodes,
        "seconds": seconds,
        "episodes_done": result.summary["total"]["episodes"],
        "machine": f"{os.cpu_count()} cores",
        "rss_mb": {
            name: {"start": s[0], "peak": max(s), "end": s[-1], "growth": s[-1] - s[0]}
            for name, s in samples.items()
        },
    }
    emit(report)


if __name__ == "__main__":
    run_benchmark(main)
