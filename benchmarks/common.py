"""Shared parts of the benchmarks: a fast OpenAI-protocol stub policy, CPU accounting, JSON out
(stdout, and the latest result of each benchmark in ``benchmarks/results/``: ``result_files``).

The stub is an aiohttp server (not Ray Serve) so that what is measured is the engine, not the
policy server: it plays the scripted policy's strategy with zero (or a fixed) think time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from result_files import save_result

from rayrollout.ports import free_port

if TYPE_CHECKING:
    from rayrollout import RolloutEngine

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def spend_cpu(ms: float) -> None:
    """Busy for ``ms`` of this process's CPU time: the work a real server does per request
    (validating, rendering, scoring), so that a benchmark can price its servers."""
    end = time.process_time() + ms / 1000
    while time.process_time() < end:
        pass


def serve_stub(port: int, latency_s: float, cpu_ms: float = 0.0) -> None:
    """Run the stub policy until killed (``python common.py stub LATENCY CPU_MS PORT``).

    ``cpu_ms`` is CPU spent per call besides the stub's own, as a heavier policy server's.
    """
    from aiohttp import web

    from rayrollout.deployments.scripted.protocol import chat_completion
    from rayrollout.deployments.scripted.strategy import next_action

    ids = itertools.count()

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if cpu_ms:
            spend_cpu(cpu_ms)
        if latency_s:
            await asyncio.sleep(latency_s)
        action = next_action(body.get("messages") or [], body.get("tools") or [])
        return web.json_response(chat_completion(action, next(ids), "stub", 10, 5))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


@contextmanager
def server_process(args: list[str], what: str) -> Iterator[tuple[int, int]]:
    """Run a benchmark server (``python <args> PORT``) in its own process; yields (port, pid)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, *args, str(port)],
        env={
            **os.environ,
            "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        },
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{what} did not start") from None
                time.sleep(0.05)
        yield port, process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextmanager
def stub_policy(latency_s: float = 0.0, cpu_ms: float = 0.0) -> Iterator[tuple[str, int]]:
    """Start the stub in its own process; yields (base_url, pid)."""
    here = os.path.abspath(__file__)
    args = [here, "stub", str(latency_s), str(cpu_ms)]
    with server_process(args, "stub policy") as (port, pid):
        yield f"http://127.0.0.1:{port}/v1", pid


@contextmanager
def nemo_gym_weather(cpu_ms: float = 0.0) -> Iterator[tuple[str, int]]:
    """Start the weather resources server (``nemo_gym_server.py``); yields (url, pid)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nemo_gym_server.py")
    with server_process([script, str(cpu_ms)], "NeMo Gym weather server") as (port, pid):
        yield f"http://127.0.0.1:{port}", pid


@contextmanager
def nemo_gym_own_server(name: str) -> Iterator[tuple[str, int]]:
    """NeMo Gym 0.7.0's own resources server ``name`` (e.g. ``example_single_tool_call``,
    its weather tool), started by its ``ng_run`` from ``.venv-nemo-gym`` as the ``nemo_gym``
    test tier does (``bash .ci/nemo_gym`` builds that venv); yields (url, the server's pid).
    Its access log is off, as in production."""

    tests = Path(__file__).resolve().parents[1] / "tests" / "nemo_gym"
    sys.path.insert(0, str(tests))
    from ngrun import NG_SRC, NemoGymRun, resources_server_block  # the tier's own helper

    if not NG_SRC.is_dir():
        raise SystemExit(
            f"--nemo-gym-server needs NeMo Gym's venv at {NG_SRC.parent}: run "
            "`bash .ci/nemo_gym` first (it builds the venv, then runs its tier)"
        )
    port = free_port()
    block = resources_server_block(name, port)
    with tempfile.TemporaryDirectory(prefix="overhead-ng-") as workdir:
        with NemoGymRun(block, Path(workdir), access_log=False) as run:
            yield f"http://127.0.0.1:{port}", run.server_pid(next(iter(block)))


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _processes_under(roots: list[int]) -> dict[int, float]:
    """CPU seconds used so far by every live process that is one of ``roots`` or descends
    from one (Ray's daemons and workers included), from /proc."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat:
                parents[int(name)], cpu[int(name)] = stat
    under = {}
    for pid, seconds in cpu.items():
        node = pid
        while node and node not in roots:
            node = parents.get(node, 0)
        if node:
            under[pid] = seconds
    return under


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root`` and every live descendant (Ray's daemons, workers)."""
    return sum(_processes_under([root]).values())


_ROLES = (  # (substring of the command line, role), first match wins
    ("ray::WorkerActor", "workers"),
    ("ray::EngineActor", "engine"),
    ("EnvironmentServer", "environment replicas"),
    ("common.py stub", "policy stub"),
    ("nemo_gym_server.py", "NeMo Gym server"),
    ("app.py", "NeMo Gym server"),  # NeMo Gym's own (``--nemo-gym-server``): ng_run's entrypoint
)


def cpu_by_process(roots: list[int]) -> dict[int, tuple[str, float]]:
    """Every live process under ``roots``: its role (workers, engine, environment replicas,
    the stub, the driver, Ray's own daemons and idle workers) and the CPU seconds it has
    used so far."""
    processes: dict[int, tuple[str, float]] = {}
    for pid, seconds in _processes_under(roots).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        role = "driver" if pid == roots[0] else "ray daemons and workers"
        for needle, name in _ROLES:
            if needle in command:
                role = name
                break
        processes[pid] = (role, seconds)
    return processes


def cpu_ms_per_episode(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], n: int
) -> dict[str, float]:
    """Per-role CPU milliseconds per episode between two ``cpu_by_process`` snapshots.

    Each process counts what it used between the two, under the role it has at the second:
    Ray hands an actor a worker process it started earlier (idle, Ray imported), and that
    process's CPU from before the first snapshot is not the actor's work in the window.
    """
    totals: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        earlier = before.get(pid, (role, 0.0))[1]
        totals[role] = totals.get(role, 0.0) + seconds - earlier
    return {
        role: round(1000 * seconds / n, 3)
        for role, seconds in sorted(totals.items(), key=lambda item: -item[1])
    }


_JSON_STDOUT: list[int] = []  # the real stdout, while fd 1 points at stderr


def keep_stdout_for_json() -> None:
    """Send everything but the result to stderr, so stdout holds one JSON object only.

    Ray's daemons and workers inherit file descriptor 1 and write log lines to it (a raylet
    warning at shutdown, say); pointing fd 1 at stderr before Ray starts keeps them out of
    the JSON that ``emit`` writes.
    """
    if not _JSON_STDOUT:
        sys.stdout.flush()
        _JSON_STDOUT.append(os.dup(1))
        os.dup2(2, 1)


def emit(result: dict[str, Any], name: str | None = None) -> None:
    """Print the benchmark's one JSON object (to the real stdout) and keep it as the latest
    result (``save_result``, under ``name`` when given)."""
    text = json.dumps(result, indent=2) + "\n"
    sys.stdout.flush()
    os.write(_JSON_STDOUT[0] if _JSON_STDOUT else 1, text.encode())
    save_result(result, name)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "stub":
    serve_stub(int(sys.argv[4]), float(sys.argv[2]), float(sys.argv[3]))


def weather_tasks(n: int, prefix: str = "w") -> list[dict[str, Any]]:
    """n single-tool weather tasks (2 model calls and 1 tool call per episode)."""
    return [
        {
            "task_id": f"{prefix}{i}",
            "prompt": f"What's the weather like in City {i}?",
            "environment": "weather",
        }
        for i in range(n)
    ]


def engine_config(base_url: str, out: str, **overrides: Any) -> dict[str, Any]:
    """A run config driving the stub at ``base_url`` (overrides merge one level deep)."""
    config: dict[str, Any] = {
        "namespace": "bench",
        "policy": {
            "kind": "openai",
            "base_url": base_url,
            "model": "stub",
            "max_retries": 0,
            "timeout_s": 120,
        },
        "workers": {"num_workers": 2},
        "concurrency": 256,
        "output": {"dir": out, "rows_per_part": 5000},
        "ray": {"num_cpus": 4},
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            config[key] = {**config.get(key, {}), **value}
        else:
            config[key] = value
    return config


def timed_collect(engine: Any, tasks: list[dict[str, Any]], stub_pid: int) -> dict[str, float]:
    """Collect ``tasks`` on a started engine; episodes/s and CPU ms/episode of every process."""
    root = os.getpid()
    cpu0 = tree_cpu_seconds(root) + tree_cpu_seconds(stub_pid)
    start = time.perf_counter()
    result = engine.collect(tasks)
    wall = time.perf_counter() - start
    cpu = tree_cpu_seconds(root) + tree_cpu_seconds(stub_pid) - cpu0
    ok = result.summary["total"]["statuses"].get("ok", 0)
    if ok != len(tasks):
        raise RuntimeError(f"only {ok} of {len(tasks)} episodes ok: {result.summary['total']}")
    return {
        "episodes_per_s": len(tasks) / wall,
        "cpu_ms_per_episode": 1000 * cpu / len(tasks),
        "seconds": wall,
    }


def start_ray() -> None:
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)


def start_ray_with_metrics() -> int:
    """A local Ray (4 CPUs) exporting its metrics, refreshed each second, on a free port: the
    port, where the benchmarks read vLLM's counters."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")  # counters arrive sooner
    metrics_port = free_port()
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=metrics_port,
    )
    return metrics_port


def stop_ray() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@contextmanager
def stub_run(latency_s: float = 0.0) -> Iterator[tuple[str, int]]:
    """The set-up every engine-against-the-stub benchmark shares; yields (base_url, stub pid).

    Keeps stdout for the one JSON object, starts a local Ray and the stub policy, and takes
    them down again (Serve included) however the run ends.
    """
    keep_stdout_for_json()
    start_ray()
    try:
        with stub_policy(latency_s) as started:
            yield started
    finally:
        stop_ray()


@contextmanager
def warm_engine(base_url: str, warm_up: int, **overrides: Any) -> Iterator[RolloutEngine]:
    """A started ``RolloutEngine`` on the stub that has already run ``warm_up`` episodes.

    The warm-up (worker processes, connections, imports) is not what a benchmark measures.
    Overrides go to ``engine_config``; its ``namespace`` also names the output folder.
    """
    from rayrollout import RolloutEngine

    with tempfile.TemporaryDirectory(prefix=f"{overrides.get('namespace', 'bench')}-") as out:
        with RolloutEngine(engine_config(base_url, out, **overrides)) as engine:
            engine.start()
            engine.collect(weather_tasks(warm_up, prefix="warm"))
            yield engine
