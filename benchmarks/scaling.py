"""Scaling: episodes/s with 1, 2 and 4 agent actors against the zero-latency stub.

Shows where the engine's ceiling is on this machine (2 cores: more agents than cores only
adds contention).

    python benchmarks/scaling.py
    python benchmarks/scaling.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import (  # noqa: E402
    emit,
    engine_config,
    keep_stdout_for_json,
    start_ray,
    stop_ray,
    stub_policy,
    timed_collect,
    weather_tasks,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="1,2,4")
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    keep_stdout_for_json()
    counts = [int(a) for a in args.agents.split(",")]
    if args.smoke:
        counts, args.episodes, args.concurrency = [1, 2], 100, 32
    from rayrollout import RolloutEngine

    results: dict[str, Any] = {
        "benchmark": "scaling",
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "machine": f"{os.cpu_count()} cores",
        "runs": [],
    }
    start_ray()
    try:
        with stub_policy() as (url, stub_pid):
            for agents in counts:
                out = tempfile.mkdtemp(prefix=f"scaling-{agents}-")
                config = engine_config(
                    url,
                    out,
                    concurrency=args.concurrency,
                    namespace=f"scaling-{agents}",
                    agents={"num_agents": agents},
                )
                with RolloutEngine(config) as engine:
                    engine.start()
                    engine.collect(weather_tasks(200, prefix="warm"))
                    measured = timed_collect(engine, weather_tasks(args.episodes), stub_pid)
                results["runs"].append({"agents": agents, **measured})
    finally:
        stop_ray()
    emit(results)


if __name__ == "__main__":
    main()
