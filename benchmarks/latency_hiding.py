"""Latency hiding: does throughput grow with concurrency when the policy is slow?

The stub answers every call after a fixed latency L; weather episodes make K = 2 model calls.
With C episodes in flight the ideal rate is C / (K * L); efficiency = measured / ideal.
Efficiency stays near 1 until CPU becomes the limit: on 2 cores that is about 1,500
episodes/s for the engine and about 2,000 for a bare asyncio loop making the same calls,
whatever C is. So each C is also run through the bare loop (``overhead.bare_loop``), and
``ratio_to_bare`` says how much of the latency hiding that the machine allows the engine
reaches. A larger ``--latency`` keeps the ideal rate under the CPU limit at high C.

    python benchmarks/latency_hiding.py                     # C in 64, 512, 2048, 8192
    python benchmarks/latency_hiding.py --latency 4 --concurrency 2048,8192
    python benchmarks/latency_hiding.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit, stub_run, timed_collect, warm_engine, weather_tasks  # noqa: E402
from overhead import run_bare  # noqa: E402
from result_files import run_benchmark  # noqa: E402

TURNS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="policy latency L, seconds")
    parser.add_argument("--concurrency", default="64,512,2048,8192")
    parser.add_argument("--waves", type=float, default=2.0, help="episodes = waves x C")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.smoke:
        levels, args.waves = [32], 1.0
    results: dict[str, Any] = {
        "benchmark": "latency_hiding",
        "latency_s": args.latency,
        "turns": TURNS,
        "machine": f"{os.cpu_count()} cores",
        "runs": [],
    }
    with stub_run(latency_s=args.latency) as (url, stub_pid):
        for c in levels:
            n = max(c, int(args.waves * c))
            warm_up = min(c, 200)
            with warm_engine(url, warm_up, concurrency=c, namespace=f"latency-{c}") as engine:
                measured = timed_collect(engine, weather_tasks(n), stub_pid)
            bare = run_bare(url, [stub_pid], n, c)  # overhead.py's loop, same C
            ideal = c / (TURNS * args.latency)
            results["runs"].append(
                {
                    "concurrency": c,
                    "episodes": n,
                    **measured,
                    "ideal_episodes_per_s": ideal,
                    "efficiency": measured["episodes_per_s"] / ideal,
                    # The bare loop's rate over its whole process (overhead.run_bare), as
                    # the engine's is over its whole collect on a warm engine.
                    "bare_loop": {**bare, "efficiency": bare["whole_episodes_per_s"] / ideal},
                    "ratio_to_bare": measured["episodes_per_s"] / bare["whole_episodes_per_s"],
                }
            )
    emit(results)


if __name__ == "__main__":
    run_benchmark(main)
