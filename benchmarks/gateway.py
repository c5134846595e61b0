"""The recording gateway: black-box programs at scale, and what the gateway path costs.

Two measurements, one engine (scripted policy on Ray Serve, weather episodes: chat ->
get_weather -> chat -> verify):

(a) acceptance: N episodes of the unmodified ``examples/openai_agent.py`` through
    ``RolloutEngine.collect`` (what ``rayrollout collect`` runs) with the ``program``
    agent, 64 subprocesses at a time. Reports rows lost and duplicated (expected 0), rows
    ok, wall time, the most programs running at once, the peak RSS summed over every
    process of the run (Ray, Serve, workers, programs; shared pages counted in each, read
    from /proc each second) and CPU ms per episode with the programs' own CPU included
    (reaped children's time, /proc ``cutime``).
(b) the gateway path against the direct path, same engine, same tasks: an in-process agent
    (``SdkAgent``, no subprocess) calling the model through the gateway with the OpenAI SDK
    and the tools through its tools route, against the built-in ``tool_loop``; episodes/s
    and CPU ms per episode (every process of the run, and the worker actors alone).

    python benchmarks/gateway.py            # (a) 500 programs, (b) 2 x 500 (4-8 min on 2 cores)
    python benchmarks/gateway.py --smoke    # tiny sizes; CI checks it still works
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from typing import Any

import aiohttp
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from common import (  # noqa: E402
    cpu_by_process,
    cpu_ms_per_episode,
    emit,
    free_port,
    keep_stdout_for_json,
    start_ray,
    stop_ray,
    weather_tasks,
)
from result_files import run_benchmark  # noqa: E402

from rayrollout.agentkit import Agent, AgentEpisode  # noqa: E402

SCRIPT = os.path.join(ROOT, "examples", "openai_agent.py")
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


class SdkAgent(Agent):
    """``examples/openai_agent.py``'s loop in-process: the model through the gateway with the
    OpenAI SDK, tools through the gateway's tools route (what a program does, minus the
    process)."""

    def __init__(self) -> None:
        self._client: openai.AsyncOpenAI | None = None
        self._http: aiohttp.ClientSession | None = None

    async def play(self, episode: AgentEpisode) -> None:
        if self._client is None or self._http is None:  # one pool per actor, as users keep
            self._client = openai.AsyncOpenAI(
                base_url="http://127.0.0.1/v1",
                api_key="set-per-episode",
                max_retries=0,
                http_client=openai.DefaultAioHttpClient(),
            )
            self._http = aiohttp.ClientSession()
        async with episode.gateway() as endpoint:
            client = self._client.with_options(base_url=endpoint.base_url, api_key=endpoint.api_key)
            headers = {"Authorization": f"Bearer {endpoint.api_key}"}
            messages: list[Any] = [m.to_openai() for m in episode.task.prompt]
            while True:
                response = await client.chat.completions.create(
                    model="m", messages=messages, tools=episode.tools
                )
                message = response.choices[0].message
                messages.append(message)
                if not message.tool_calls:
                    return
                for call in message.tool_calls:
                    name, arguments = call.function.name, call.function.arguments
                    url = f"{endpoint.tools_url}/{name}"
                    async with self._http.post(url, data=arguments, headers=headers) as answer:
                        result = await answer.text()
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


# ---------------------------------------------------------------------- /proc


def _processes() -> dict[int, tuple[int, list[str]]]:
    """Every live process: pid -> (parent pid, its /proc stat fields after the name)."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[int(name)] = (int(fields[1]), fields)
    return found


def _under(root: int, processes: dict[int, tuple[int, list[str]]]) -> list[int]:
    """``root`` and its live descendants."""
    out = []
    for pid in processes:
        node = pid
        while node and node != root:
            node = processes[node][0] if node in processes else 0
        if node:
            out.append(pid)
    return out


def tree_cpu_with_children(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants, with their reaped children's (the
    programs, each reaped by its worker actor) included."""
    processes = _processes()
    total = 0
    for pid in _under(root, processes):
        fields = processes[pid][1]
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return total / TICKS


class Sampler:
    """Once a second: the RSS summed over the run's processes, and how many programs run."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peak_rss_mib = 0.0
        self.peak_programs = 0
        self.peak_programs_rss_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            processes = _processes()
            rss = programs = programs_rss = 0
            for pid in _under(self.root, processes):
                pages = int(processes[pid][1][21])
                rss += pages
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as file:
                        is_program = b"openai_agent.py" in file.read()
                except OSError:
                    continue
                if is_program:
                    programs += 1
                    programs_rss += pages
            self.peak_rss_mib = max(self.peak_rss_mib, rss * PAGE / 2**20)
            self.peak_programs = max(self.peak_programs, programs)
            self.peak_programs_rss_mib = max(
                self.peak_programs_rss_mib, programs_rss * PAGE / 2**20
            )


# ---------------------------------------------------------------------- the runs


def config(out: str, concurrency: int) -> dict[str, Any]:
    return {
        "namespace": "bench-gateway",
        "policy": {"kind": "scripted", "max_retries": 0, "timeout_s": 120},
        "agent": "program",
        "agent_settings": {
            "program": {"args": {"command": [sys.executable, SCRIPT], "timeout_s": 600}},
            "sdk": {"path": "gateway:SdkAgent"},
        },
        "workers": {"num_workers": 2},
        "concurrency": concurrency,
        "output": {"dir": out, "rows_per_part": 5000},
        "ray": {"serve_port": free_port()},
    }


def acceptance(engine: Any, n: int) -> dict[str, Any]:
    """(a): n program episodes; rows checked one by one."""
    root = os.getpid()
    tasks = weather_tasks(n, prefix="prog")
    cpu0 = tree_cpu_with_children(root)
    with Sampler(root) as sampler:
        start = time.perf_counter()
        result = engine.collect(tasks)
        wall = time.perf_counter() - start
    cpu = tree_cpu_with_children(root) - cpu0
    rows = [t for t in result.trajectories() if t.task_id.startswith("prog")]
    keys = [(t.task_id, t.sample_index) for t in rows]
    expected = {(task["task_id"], 0) for task in tasks}
    statuses: dict[str, int] = {}
    for t in rows:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    return {
        "episodes": n,
        "concurrency": engine.config.concurrency,
        "rows": len(rows),
        "lost": len(expected - set(keys)),
        "duplicated": len(keys) - len(set(keys)),
        "rows_ok": statuses.get("ok", 0),
        "statuses": statuses,
        "reward_mean": round(sum(t.reward for t in rows) / max(1, len(rows)), 4),
        "played_by": sorted({t.played_by for t in rows}),
        "turns_extending": sum(t.extends_previous for r in rows for t in r.turns),
        "errors_sample": sorted({t.error for t in rows if t.error})[:3],
        "wall_s": round(wall, 2),
        "episodes_per_s": round(n / wall, 2),
        "cpu_ms_per_episode_with_programs": round(1000 * cpu / n, 1),
        "peak_programs_running": sampler.peak_programs,
        "peak_rss_mib_all_processes": round(sampler.peak_rss_mib, 1),
        "peak_rss_mib_programs": round(sampler.peak_programs_rss_mib, 1),
    }


def timed(engine: Any, agent: str, n: int, prefix: str) -> dict[str, Any]:
    """n in-process episodes played by ``agent``: rate and CPU per episode."""
    root = os.getpid()
    tasks = [{**task, "agent": agent} for task in weather_tasks(n, prefix=prefix)]
    before = cpu_by_process([root])
    start = time.perf_counter()
    result = engine.collect(tasks)
    wall = time.perf_counter() - start
    by_role = cpu_ms_per_episode(before, cpu_by_process([root]), n)
    ok = result.summary["total"]["statuses"].get("ok", 0)
    if ok < n:
        raise RuntimeError(f"{agent}: only {ok} of {n} episodes ok: {result.summary['total']}")
    return {
        "episodes_per_s": round(n / wall, 1),
        "cpu_ms_per_episode": round(sum(by_role.values()), 2),
        "worker_cpu_ms_per_episode": round(by_role.get("workers", 0.0), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=500, help="(a): program episodes")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--in-process", type=int, default=500, help="(b): episodes per path")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args()
    if args.smoke:
        args.programs, args.concurrency, args.in_process = 8, 8, 16
    keep_stdout_for_json()
    # The worker actors import SdkAgent as gateway:SdkAgent: they inherit this path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p
    )
    start_ray()
    from rayrollout import RolloutEngine

    out = tempfile.mkdtemp(prefix="bench-gateway-")
    try:
        with RolloutEngine(config(out, args.concurrency)) as engine:
            engine.start()
            warm = max(8, args.concurrency // 4)
            for agent in ("tool_loop", "sdk"):  # workers, imports, pools: not measured
                engine.collect(
                    [{**t, "agent": agent} for t in weather_tasks(warm, prefix=f"w{agent}")]
                )
            direct = timed(engine, "tool_loop", args.in_process, "direct")
            gateway = timed(engine, "sdk", args.in_process, "gateway")
            programs = acceptance(engine, args.programs)
    finally:
        stop_ray()
    emit(
        {
            "benchmark": "gateway",
            "smoke": args.smoke,
            "cpus": os.cpu_count(),
            "a_programs": programs,
            "b_in_process": {
                "episodes": args.in_process,
                "direct_tool_loop": direct,
                "gateway_sdk": gateway,
                "rate_ratio_gateway_over_direct": round(
                    gateway["episodes_per_s"] / direct["episodes_per_s"], 3
                ),
                "cpu_ratio_gateway_over_direct": round(
                    gateway["cpu_ms_per_episode"] / direct["cpu_ms_per_episode"], 3
                ),
            },
        }
    )


if __name__ == "__main__":
    run_benchmark(main)
