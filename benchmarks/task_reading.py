"""Task reading: rows per second read and checked, and the driver's bytes per row, by size.

A NeMo Gym tasks file (a prompt and one tool schema a row, about 500 bytes a line, no ids:
each row numbered by its line) of 10^4, 10^5 and 10^6 rows is planned and streamed the way
``collect`` does it (``plan_collect``, then every episode spec taken from ``plan.specs()``,
no engine), each size in a fresh process. Reported per size: rows per second, what the
process's peak RSS grew by over its RSS after imports (``held_mb``: flat memory keeps it near
a constant, the head of 1,000 checked tasks and buffers) and that per row, and the digests'
own bytes per row (their sorted runs; keys still in the buffer, under 16,384, are not
counted). For contrast, the smallest size
is also read into a list of ``Task`` objects, as ``collect`` held it before it streamed.

    python benchmarks/task_reading.py            # 10^4, 10^5, 10^6 rows
    python benchmarks/task_reading.py --smoke    # 10^3, 10^4 rows
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit  # noqa: E402
from result_files import run_benchmark  # noqa: E402

CITIES = ["Tokyo", "Oslo", "Lima", "Cairo", "Perth", "Quito", "Hanoi", "Accra"]
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city: the temperature in degrees Celsius, "
    "the sky's conditions and the wind's speed.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city's name, as in 'Tokyo' or 'Oslo'"}
        },
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def write_tasks(path: Path, rows: int) -> None:
    """A NeMo Gym weather tasks file of ``rows`` lines."""
    with path.open("w") as file:
        for i in range(rows):
            city = CITIES[i % len(CITIES)]
            prompt = f"What's the weather like in {city}?"
            row = {"responses_create_params": {"input": [{"role": "user", "content": prompt}]}}
            row["responses_create_params"]["tools"] = [TOOL]
            file.write(json.dumps(row) + "\n")


def rss_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(path: str, mode: str) -> dict[str, Any]:
    """In this process: read ``path`` the way ``collect`` streams it (``stream``) or into a
    list of tasks (``list``); rows, seconds and memory."""
    from rayrollout.api.collect import plan_collect
    from rayrollout.data.config import RunConfig
    from rayrollout.data.tasks import read_tasks

    config = RunConfig.model_validate({"environment": "weather"})
    base = rss_bytes()
    started = time.perf_counter()
    if mode == "list":
        held = list(read_tasks(path, default_environment="weather"))
        rows, digest_bytes = len(held), 0
    else:
        plan = plan_collect(path, config)
        rows = sum(1 for _ in plan.specs())
        digest_bytes = plan.ids.nbytes
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "rows": rows,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "rss_after_imports_mb": base / 2**20,
        "peak_rss_mb": peak / 2**20,
        "held_mb": (peak - base) / 2**20,
        "bytes_per_row": (peak - base) / rows,
        "digest_bytes_per_row": digest_bytes / rows,
    }


def in_fresh_process(path: Path, mode: str) -> dict[str, Any]:
    here = os.path.abspath(__file__)
    done = subprocess.run(
        [sys.executable, here, "--measure", str(path), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="10^3 and 10^4 rows")
    parser.add_argument("--sizes", type=int, nargs="*", help="row counts (default 10^4-10^6)")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)  # PATH MODE, internal
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    sizes = args.sizes or ([1_000, 10_000] if args.smoke else [10_000, 100_000, 1_000_000])
    by_size: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="task-reading-") as folder:
        for rows in sizes:
            path = Path(folder) / f"tasks-{rows}.jsonl"
            write_tasks(path, rows)
            by_size[str(rows)] = {
                "file_mb": path.stat().st_size / 2**20,
                **in_fresh_process(path, "stream"),
            }
            if rows == sizes[0]:
                held = in_fresh_process(path, "list")
            path.unlink()
    largest = by_size[str(sizes[-1])]
    emit(
        {
            "benchmark": "task_reading",
            "machine": f"{os.cpu_count()} cores",
            "sizes": by_size,
            "tasks_held_in_a_list": {"rows": sizes[0], **held},
            "held_over_streamed_bytes_per_row": held["bytes_per_row"]
            / max(by_size[str(sizes[0])]["bytes_per_row"], 1.0),
            "largest_over_smallest_seconds_per_row": (
                (largest["seconds"] / largest["rows"])
                / (by_size[str(sizes[0])]["seconds"] / sizes[0])
            ),
        }
    )


if __name__ == "__main__":
    run_benchmark(main)
