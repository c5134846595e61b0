"""Chaos run: a real `rayrollout collect` under load, with its processes killed, then resumed.

Two busy-loop processes keep both cores busy the whole time. The run collects booking
episodes (a stateful environment on 2 Serve replicas) and weather episodes (inline) with the
scripted policy, and while it runs this script SIGKILLs, by PID and in this order: a worker
actor, an environment replica, a worker, the engine actor (the driver then stops with its
one-line message), and, in the `--resume` run after that, a worker and the driver itself.
A last `--resume` finishes. The output folder is then read back and checked: every
`(task_id, sample_index)` exactly once, and no row with status `error`.

Kills are triggered by rows written (the parts in the folder), not by the clock, so a slow
machine kills at the same points of the run. Every process this script or its runs started
is ended by PID at the end; nothing else is touched.

Prints one JSON object: per run its kills and exit code, and the counts of the folder.

    python benchmarks/chaos.py                 # 3,000 episodes
    python benchmarks/chaos.py --episodes 600  # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

# this folder is on sys.path: the benchmark runs as a script
from result_files import run_benchmark, save_result

ROOT = Path(__file__).resolve().parents[1]
RAYROLLOUT = str(Path(sys.executable).with_name("rayrollout"))

BOOKING = {"prompt": "Book a suite for 2 nights.", "goal": [{"room": "suite", "nights": 2}]}
WEATHER = {"prompt": "What's the weather like in Oslo?"}


def write_inputs(folder: Path, episodes: int) -> tuple[Path, Path]:
    """The tasks file (half booking, half weather) and the run's config."""
    tasks = folder / "tasks.jsonl"
    with tasks.open("w") as out:
        for i in range(episodes):
            kind = (
                {"environment": "booking", **BOOKING}
                if i % 2
                else {"environment": "weather", **WEATHER}
            )
            row = {"task_id": f"t{i:05d}", **kind}
            out.write(json.dumps(row) + "\n")
    config = folder / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "namespace": "chaos",
                "concurrency": 64,
                "policy": {"kind": "scripted", "scripted": {"latency_s": 0.2}},
                "workers": {"num_workers": 2},
                "environments": {"booking": {"hosting": "serve", "replicas": 2}},
                "output": {"rows_per_part": 50, "flush_interval_s": 1.0},
            }
        )
    )
    return tasks, config


def processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, command line)."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        found[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), args)
    return found


def descendants(root: int) -> dict[int, str]:
    """The processes below ``root`` (a run's driver: its local Ray and every actor)."""
    table = processes()
    ours, frontier = {}, {root}
    while frontier:
        children = {p for p, (parent, _) in table.items() if parent in frontier} - set(ours)
        ours.update({p: table[p][1] for p in children})
        frontier = children
    return ours


def find(root: int, marker: str) -> int | None:
    """The first process below ``root`` whose command line has ``marker``."""
    for pid, args in sorted(descendants(root).items()):
        if marker in args:
            return pid
    return None


def rows_written(out: Path) -> int:
    """Rows in the folder's finished parts (Parquet footers only)."""
    import pyarrow.parquet as pq

    total = 0
    for part in out.glob("part-*.parquet"):
        try:
            total += pq.ParquetFile(part).metadata.num_rows
        except Exception:  # a part being renamed into place right now
            continue
    return total


def run_collect(
    tasks: Path, config: Path, out: Path, resume: bool, kills: list[tuple[int, str]]
) -> dict[str, Any]:
    """One `collect`; ``kills`` are (rows written, what) pairs: worker, replica, engine, driver."""
    command = [RAYROLLOUT, "collect", str(tasks), "--config", str(config), "--out", str(out)]
    if resume:
        command.append("--resume")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = (out.parent / f"driver-{int(time.time())}.log").open("w")
    driver = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    started_rows = rows_written(out)
    done: list[dict[str, Any]] = []
    seen: dict[int, str] = {}
    markers = {
        "worker": "ray::WorkerActor",
        "replica": "EnvironmentServer",
        "engine": "ray::EngineActor",
    }
    pending = list(kills)
    while driver.poll() is None:
        seen.update(descendants(driver.pid))
        new_rows = rows_written(out) - started_rows
        if pending and new_rows >= pending[0][0]:
            at, what = pending.pop(0)
            pid = driver.pid if what == "driver" else find(driver.pid, markers[what])
            if pid is None:
                pending.insert(0, (at, what))  # not up yet (a restarting actor): next poll
            else:
                os.kill(pid, signal.SIGKILL)
                done.append({"killed": what, "pid": pid, "after_rows": new_rows})
        time.sleep(0.5)
    log.close()
    time.sleep(3)  # let a killed driver's Ray notice and exit by itself
    leftover = [p for p in seen if p in processes()]
    for pid in leftover:  # only what this run started: its driver's descendants
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    tail = Path(log.name).read_text().strip().splitlines()[-3:]
    return {
        "resume": resume,
        "exit_code": driver.returncode,
        "kills": done,
        "rows_this_run": rows_written(out) - started_rows,
        "driver_tail": tail,
        "leftover_processes_ended": len(leftover),
    }


def check(out: Path, episodes: int) -> dict[str, Any]:
    """Every (task_id, sample_index) once; statuses and error reasons."""
    import pyarrow.parquet as pq

    parts = sorted(out.glob("part-*.parquet"))
    frame = pq.read_table(parts).to_pandas() if parts else None
    rows = 0 if frame is None else len(frame)
    pairs = [] if frame is None else zip(frame.task_id, frame.sample_index, strict=True)
    keys = Counter(pairs)
    statuses = {} if frame is None else frame.status.value_counts().to_dict()
    errors = (
        {}
        if frame is None
        else Counter(str(e).splitlines()[0][:120] for e in frame.error[frame.status == "error"])
    )
    return {
        "expected": episodes,
        "rows": rows,
        "unique": len(keys),
        "lost": episodes - len(keys),
        "duplicated": sum(n - 1 for n in keys.values() if n > 1),
        "statuses": statuses,
        "error_reasons": dict(errors.most_common(5)),
    }


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that keep a core busy each."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--burners", type=int, default=2, help="busy-loop processes (load)")
    args = parser.parse_args()
    n = args.episodes
    with tempfile.TemporaryDirectory(prefix="rayrollout-chaos-") as tmp:
        folder = Path(tmp)
        tasks, config = write_inputs(folder, n)
        out = folder / "out"
        load = burners(args.burners)
        started = time.perf_counter()
        try:
            runs = [
                run_collect(
                    tasks,
                    config,
                    out,
                    False,
                    [
                        (n // 10, "worker"),
                        (n // 5, "replica"),
                        (3 * n // 10, "worker"),
                        (2 * n // 5, "engine"),
                    ],
                ),
                run_collect(tasks, config, out, True, [(n // 10, "worker"), (n // 5, "driver")]),
                run_collect(tasks, config, out, True, []),
            ]
        finally:
            for process in load:
                process.kill()
        result = {
            "episodes": n,
            "burners": args.burners,
            "seconds": round(time.perf_counter() - started, 1),
            "runs": runs,
            "folder": check(out, n),
        }
    print(json.dumps(result, indent=1))
    save_result(result)


if __name__ == "__main__":
    run_benchmark(main)
