"""Kills mid-run at scale: a worker, the engine actor, the driver; then ``--resume``.

Each scenario collects N single-tool weather episodes against the zero-latency stub policy
(workers write their own parts), SIGKILLs one process about a third of the way in, and,
where the run cannot finish by itself (the engine or the driver died), runs it again with
``resume=True`` into the same folder. The folder is then read whole: every
``(task_id, sample_index)`` exactly once, nothing else (``rows_lost``, ``rows_duplicated``).

    python benchmarks/kill_resume.py                  # 10,000 episodes a scenario
    python benchmarks/kill_resume.py --episodes 2000 --scenarios worker,engine
    python benchmarks/kill_resume.py --smoke          # seconds; CI checks it still works
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

from common import (
    emit,
    engine_config,
    keep_stdout_for_json,
    start_ray,
    stop_ray,
    stub_policy,
    weather_tasks,
)
from result_files import run_benchmark

SCENARIOS = ("worker", "engine", "driver")


def actor_pid(handle: Any) -> int:
    import ray

    info = ray._private.state.actors(actor_id=handle._actor_id.hex())
    return int(info["Pid"])


def config(url: str, out: str, namespace: str, resume: bool = False) -> dict[str, Any]:
    return engine_config(
        url,
        out,
        namespace=namespace,
        output={"rows_per_part": 500, "flush_interval_s": 1.0},
        resume=resume,
    )


def check(out: str, n: int) -> dict[str, Any]:
    """The folder's rows against the N expected: lost, duplicated, statuses."""
    from rayrollout.data.run_folder import RunFolder

    folder = RunFolder(out)
    keys = Counter(folder.written_pairs())
    expected = {(f"w{i}", 0) for i in range(n)}
    statuses = Counter(row["status"] for _, row in folder.rows(["status"]))
    return {
        "episodes": n,
        "rows": sum(keys.values()),
        "rows_lost": len(expected - set(keys)),
        "rows_duplicated": sum(c - 1 for c in keys.values()),
        "rows_unexpected": len(set(keys) - expected),
        "statuses": dict(statuses),
        "parts": len(folder.parts()),
    }


def kill_when(done: int, pid: Any, killed: list[int]) -> Any:
    def on_progress(snapshot: dict[str, Any]) -> None:
        if not killed and snapshot["total"]["episodes"] >= done and snapshot["in_flight"]:
            target = pid()
            os.kill(target, signal.SIGKILL)
            killed.append(target)

    return on_progress


def resume(url: str, out: str, namespace: str, n: int) -> None:
    from rayrollout import RolloutEngine

    with RolloutEngine(config(url, out, namespace, resume=True)) as engine:
        engine.collect(weather_tasks(n))


def worker_scenario(url: str, n: int) -> dict[str, Any]:
    import ray

    from rayrollout import RolloutEngine

    out, killed = tempfile.mkdtemp(prefix="kill-worker-"), []
    start = time.perf_counter()
    with RolloutEngine(config(url, out, "kill-worker")) as engine:
        engine.start()
        worker = ray.get_actor("worker:0", namespace="kill-worker")
        engine.collect(
            weather_tasks(n), on_progress=kill_when(n // 3, lambda: actor_pid(worker), killed)
        )
    return {"killed": len(killed), "seconds": time.perf_counter() - start, **check(out, n)}


def engine_scenario(url: str, n: int) -> dict[str, Any]:
    from rayrollout import RolloutEngine
    from rayrollout.api.rollout_engine import EngineDiedError

    out, killed = tempfile.mkdtemp(prefix="kill-engine-"), []
    start = time.perf_counter()
    died = False
    with RolloutEngine(config(url, out, "kill-engine")) as engine:
        engine.start()
        try:
            engine.collect(
                weather_tasks(n),
                on_progress=kill_when(n // 3, lambda: actor_pid(engine.engine), killed),
            )
        except EngineDiedError:
            died = True
    before = check(out, n)["rows"]
    resume(url, out, "kill-engine-resumed", n)
    return {
        "killed": len(killed),
        "engine_died_error": died,
        "rows_before_resume": before,
        "seconds": time.perf_counter() - start,
        **check(out, n),
    }


def driver_scenario(url: str, n: int) -> dict[str, Any]:
    import ray

    from rayrollout.data.run_folder import RunFolder

    out = tempfile.mkdtemp(prefix="kill-driver-")
    start = time.perf_counter()
    address = ray.get_runtime_context().gcs_address
    driver = subprocess.Popen(
        [sys.executable, __file__, "--driver", url, out, str(n), address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    killed = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and driver.poll() is None:
        if len(RunFolder(out).written_keys()) >= n // 3:
            driver.send_signal(signal.SIGKILL)
            killed = 1
            break
        time.sleep(0.2)
    driver.wait()
    before = check(out, n)["rows"]
    resume(url, out, "kill-driver-resumed", n)
    return {
        "killed": killed,
        "rows_before_resume": before,
        "seconds": time.perf_counter() - start,
        **check(out, n),
    }


def driver_main(url: str, out: str, n: int, address: str) -> None:
    """The driver to be killed: its own process, attached to the benchmark's Ray."""
    import ray

    from rayrollout import RolloutEngine

    ray.init(address=address, log_to_driver=False)
    with RolloutEngine(config(url, out, "kill-driver")) as engine:
        engine.collect(weather_tasks(n))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--smoke", action="store_true", help="300 episodes a scenario")
    parser.add_argument("--driver", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        url, out, n, address = args.driver
        driver_main(url, out, int(n), address)
        return
    keep_stdout_for_json()
    n = 300 if args.smoke else args.episodes
    start_ray()
    results: dict[str, Any] = {
        "benchmark": "kill_resume",
        "episodes_per_scenario": n,
        "machine": f"{os.cpu_count()} cores",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    runs = {"worker": worker_scenario, "engine": engine_scenario, "driver": driver_scenario}
    try:
        with stub_policy() as (url, _):
            for name in args.scenarios.split(","):
                results[name] = runs[name](url, n)
    finally:
        stop_ray()
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    results["met"] = all(
        results[name]["rows_lost"] == 0
        and results[name]["rows_duplicated"] == 0
        and results[name]["rows_unexpected"] == 0
        and results[name]["killed"] == 1
        for name in args.scenarios.split(",")
    )
    emit(results)


if __name__ == "__main__":
    run_benchmark(main)
