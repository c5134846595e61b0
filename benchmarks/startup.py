"""Start-up: seconds from typing a command to its first finished episode, as a user meets them.

Each case runs the real ``rayrollout`` command in a fresh process (a local Ray of its own, as
on a laptop) and times, from the moment the process is started:

- ``ready_s``: the line ``policy: ...`` on the console, printed once Ray, the policy and the
  engine with its workers are up and the run is planned (``rayrollout.cli.collect``);
- ``first_episode_s``: the first part file in the output folder. The run's config writes a
  part per row (``output.rows_per_part: 1``) so the first finished episode is a file as soon
  as it reaches the writer. A file, not a progress line: the bar is not drawn when stderr is
  no terminal, and a file is what a user (or a trainer reading the folder) waits for;
- ``total_s``: the command's exit, Ray's shutdown included.

Cases: ``collect`` with an external OpenAI-protocol policy (``common.py``'s stub) and inline
environments; the same with the environment a NeMo Gym resources server by URL
(``nemo_gym_server.py``), a run that needs no Serve; ``rayrollout demo`` (scripted policy on
Serve, the environments' examples); and ``rayrollout --help`` / ``collect --help`` /
``import rayrollout`` (wall time of a process that starts no Ray).

    python benchmarks/startup.py            # 50 episodes per collect, 2 runs of each case
    python benchmarks/startup.py --smoke    # one small collect and the --help timings
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import (  # noqa: E402
    emit,
    free_port,
    keep_stdout_for_json,
    nemo_gym_weather,
    stub_policy,
    weather_tasks,
)
from result_files import run_benchmark  # noqa: E402

READY_LINE = "policy: "


def rayrollout_command() -> list[str]:
    """The installed console script next to this Python, else ``python -m rayrollout.cli``."""
    script = Path(sys.executable).with_name("rayrollout")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rayrollout.cli"]


def child_env() -> dict[str, str]:
    """The commands' environment: a local Ray of their own, no usage stats, a dummy key."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OPENAI_API_KEY": "EMPTY"}
    env.pop("RAY_ADDRESS", None)
    return env


def timed_run(argv: list[str], out_dir: Path | None, timeout_s: float = 600) -> dict[str, Any]:
    """Run one command; seconds to its ``policy:`` line, its first part file, and its exit."""
    ready: list[float] = []
    tail: list[str] = []
    start = time.perf_counter()
    process = subprocess.Popen(
        argv,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def read_console() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if not ready and line.startswith(READY_LINE):
                ready.append(time.perf_counter() - start)
            tail[:] = [*tail[-20:], line]

    reader = threading.Thread(target=read_console, daemon=True)
    reader.start()
    first: float | None = None
    while process.poll() is None:
        if out_dir is not None and first is None and any(out_dir.glob("part-*")):
            first = time.perf_counter() - start
        if time.perf_counter() - start > timeout_s:
            process.kill()
            raise RuntimeError(f"{argv} ran past {timeout_s} s")
        time.sleep(0.02)
    total = time.perf_counter() - start
    reader.join(timeout=5)
    if process.returncode != 0:
        raise RuntimeError(f"{argv} exited {process.returncode}:\n{''.join(tail)}")
    if out_dir is not None and first is None and any(out_dir.glob("part-*")):
        first = total  # written in the last 20 ms: the poll did not see it before the exit
    return {
        "ready_s": round(ready[0], 2) if ready else None,
        "first_episode_s": round(first, 2) if first is not None else None,
        "total_s": round(total, 2),
    }


def write_config(folder: Path, namespace: str) -> Path:
    """A config file: a part per row, a Serve port of its own, a namespace of its own."""
    config = {
        "namespace": namespace,
        "output": {"rows_per_part": 1},
        "ray": {"serve_port": free_port()},
    }
    path = folder / f"{namespace}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def collect_case(
    work: Path, name: str, episodes: int, base_url: str, env_url: str | None
) -> dict[str, Any]:
    """One ``rayrollout collect`` of ``episodes`` weather tasks against the stub policy."""
    tasks = work / f"{name}-tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in weather_tasks(episodes)))
    out = work / f"{name}-out"
    shutil.rmtree(out, ignore_errors=True)
    argv = [
        *rayrollout_command(),
        "collect",
        str(tasks),
        "--out",
        str(out),
        "--base-url",
        base_url,
        "--model",
        "stub",
        "--config",
        str(write_config(work, name)),
    ]
    if env_url:
        argv += ["--env-url", f"weather={env_url}"]
    return timed_run(argv, out)


def demo_case(work: Path, name: str, repeats: int) -> dict[str, Any]:
    """``rayrollout demo``: the scripted policy on Serve, every built-in environment.

    A folder per run: a second run in the same one would find the first run's parts."""
    out = work / f"{name}-out"
    argv = [
        *rayrollout_command(),
        "demo",
        "--out",
        str(out),
        "--num-repeats",
        str(repeats),
        "--config",
        str(write_config(work, name)),
    ]
    return timed_run(argv, out)


def help_case(argv: list[str], runs: int) -> dict[str, float]:
    """Median and best wall seconds of a command that starts no Ray."""
    seconds = [timed_run(argv, None)["total_s"] for _ in range(runs)]
    return {"median_s": round(statistics.median(seconds), 2), "min_s": round(min(seconds), 2)}


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs, and the runs themselves."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [run[key] for run in runs if run[key] is not None]
        out[key] = round(statistics.median(values), 2) if values else None
    return {**out, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=50, help="episodes per collect")
    parser.add_argument("--runs", type=int, default=2, help="runs of each collect case")
    parser.add_argument("--smoke", action="store_true", help="one small collect, --help")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.runs = 4, 1
    keep_stdout_for_json()
    command = rayrollout_command()
    result: dict[str, Any] = {
        "benchmark": "startup",
        "smoke": args.smoke,
        "episodes": args.episodes,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "first_episode": "first part file in --out (output.rows_per_part: 1)",
        "help": {
            "rayrollout --help": help_case([*command, "--help"], 3),
            "rayrollout collect --help": help_case([*command, "collect", "--help"], 3),
            "import rayrollout": help_case([sys.executable, "-c", "import rayrollout"], 3),
        },
    }
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        work = Path(tmp)
        cases: dict[str, Any] = {}
        with stub_policy() as (base_url, _):
            cases["collect_external_inline"] = median_of(
                [
                    collect_case(work, f"inline{i}", args.episodes, base_url, None)
                    for i in range(args.runs)
                ]
            )
            if not args.smoke:
                with nemo_gym_weather() as (env_url, _):
                    cases["collect_external_env_url"] = median_of(
                        [
                            collect_case(work, f"url{i}", args.episodes, base_url, env_url)
                            for i in range(args.runs)
                        ]
                    )
        if not args.smoke:
            cases["demo"] = median_of([demo_case(work, f"demo{i}", 1) for i in range(args.runs)])
        result["cases"] = cases
    result["load_average_1m_after"] = round(os.getloadavg()[0], 1)
    emit(result)


if __name__ == "__main__":
    run_benchmark(main)
