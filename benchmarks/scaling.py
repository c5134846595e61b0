"""Scaling: episodes/s with 1, 2 and 4 worker actors against the zero-latency stub.

Shows where the engine's ceiling is on this machine (2 cores: more workers than cores only
adds contention).

    python benchmarks/scaling.py
    python benchmarks/scaling.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit, stub_run, timed_collect, warm_engine, weather_tasks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    counts = [int(a) for a in args.workers.split(",")]
    if args.smoke:
        counts, args.episodes, args.concurrency = [1, 2], 100, 32
    results: dict[str, Any] = {
        "benchmark": "scaling",
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "machine": f"{os.cpu_count()} cores",
        "runs": [],
    }
    with stub_run() as (url, stub_pid):
        for workers in counts:
            with warm_engine(
                url,
                200,
                concurrency=args.concurrency,
                namespace=f"scaling-{workers}",
                workers={"num_workers": workers},
            ) as engine:
                measured = timed_collect(engine, weather_tasks(args.episodes), stub_pid)
            results["runs"].append({"workers": workers, **measured})
    emit(results)


if __name__ == "__main__":
    main()
