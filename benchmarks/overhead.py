"""Engine overhead against a bare loop of the same calls; one job: both sides, one run, one ratio.

rayrollout against a bare asyncio + aiohttp loop making the same calls. The file is long
because the bare loop mirrors the engine's calls one by one for each hosting mode, and both
sides are measured in one file so the ratios come from one run.

Both play the same NeMo Gym rows (``responses_create_params`` with the prompt and the
``get_weather`` tool) as single-tool weather episodes against the same zero-latency
OpenAI-protocol stub (its own process): chat -> get_weather -> chat -> verify. The bare loop
is one process with no Ray, no validation and no output; the engine runs its workers,
environments and writer (Parquet).

The bare loop makes exactly the engine's calls, request by request, because a floor that
does less (or more) than the engine measures that difference instead of the engine: the
policy's pool of its own with the engine's headers (``Authorization``, ``x-session-id``)
and body (``tools``, ``tool_choice``, messages as the engine renders them, orjson); for the
``url`` mode also ``/seed_session`` with the whole row, ``/get_weather`` with the parsed
arguments as JSON, ``/verify`` with the row and the whole Responses-API ``response``,
``/close_session`` with the 0.7.0 body (each encoded by orjson), each episode on its own
``ClientSession`` and cookie jar over one shared connector, as ``RemoteSession`` does.

Hosting modes: ``inline`` (the environment in the workers), ``serve`` (Serve replicas, called
by deployment handles), ``serve-stateful`` (per-episode state, ``stateful_weather.py``: a
session per episode pinned to one replica) and ``url`` (a NeMo Gym resources server by URL,
``nemo_gym_server.py``, a plain aiohttp process). Every Serve or inline mode is compared with
the bare loop that runs the tool in-process; ``url`` with the bare loop calling the same
server.

Two ratios per mode, engine episodes/s over the bare loop's:

* ``steady``: each side's rate in its steady middle part, read from the episodes' own end
  times: the 10th to the 90th percentile of finishes, 0.8 N episodes over the time between
  them, so start-up, ramp-up and the tail are out of both.
* ``whole``: N episodes over the whole command: for the engine from ``RolloutEngine(config)``
  to the end of its ``with`` block (workers started, Serve app deployed where the mode needs
  one, every episode collected and written, shut down; the local Ray is already up, as an
  attached cluster would be); for the bare loop from starting its process to its exit.

The engine's rows also say where its episode time went (model, tools, verify, other: the
rest, session set-up and close included), set beside the bare loop's own per-call times.

    python benchmarks/overhead.py                 # full run (20,000 rows, 256 in flight; 2-3 min)
    python benchmarks/overhead.py --latency 0.1   # the policy thinks 100 ms a call, as a model does
    python benchmarks/overhead.py --server-cpu-ms 0.45  # servers that work 0.45 ms a request
    python benchmarks/overhead.py --modes url --nemo-gym-server example_single_tool_call
                                                  # by URL against NeMo Gym's own weather server
    python benchmarks/overhead.py --smoke         # seconds; CI checks it still works

Where the gap comes from is in the CPU figures: ``client_cpu_ms_per_episode`` is the bare
loop's own process, ``engine_side_cpu_ms_per_episode`` every process of the engine's (workers,
engine actor, driver, Ray's daemons; servers left out), and ``cpu_ratio`` the second over the
first. With a policy that costs nothing, two cores run out before either side's concurrency
does, so ``ratio_steady`` is close to the bare loop's CPU share of the engine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import (  # noqa: E402
    cpu_by_process,
    cpu_ms_per_episode,
    emit,
    keep_stdout_for_json,
    nemo_gym_own_server,
    nemo_gym_weather,
    start_ray,
    stop_ray,
    stub_policy,
    tree_cpu_seconds,
)
from result_files import run_benchmark  # noqa: E402

PROMPT = "What's the weather like in City {i}?"
# Modes that are more than a hosting name: (the config entry, which the tasks name; its
# settings). A class other than the registered one needs a name of its own.
HOSTING_CONFIGS = {
    "serve-stateful": (
        "weather_stateful",
        {"path": "stateful_weather:StatefulWeather", "hosting": "serve"},
    ),
}
STEADY = (0.1, 0.9)  # the share of finishes that bounds the steady part
ENV_TIMEOUT_S = 60.0  # EnvironmentConfig's default timeout_s: the engine's per-request limit


def task_rows(episodes: int, environment: str = "weather") -> list[dict[str, Any]]:
    """The NeMo Gym rows both sides play: the prompt and the tool in ``responses_create_params``.

    A row without tools would leave a URL environment with none (a resources server
    publishes no schemas), so the model would answer at once: two calls fewer per episode.
    """
    from rayrollout.data.convert import chat_tools_to_responses
    from rayrollout.environments.weather.env import WeatherEnv

    tools = chat_tools_to_responses(WeatherEnv.tool_schemas())
    return [
        {
            "task_id": f"w{i}",
            "environment": environment,
            "responses_create_params": {
                "input": [{"role": "user", "content": PROMPT.format(i=i)}],
                "tools": tools,
            },
        }
        for i in range(episodes)
    ]


def steady_rate(finished: list[float]) -> float:
    """Episodes/s between the ``STEADY`` percentiles of the finish times."""
    ends = sorted(finished)
    low, high = (round(share * (len(ends) - 1)) for share in STEADY)
    span = ends[high] - ends[low]
    return (high - low) / span if span > 0 else float("nan")


async def bare_loop(
    base_url: str, episodes: int, concurrency: int, env_url: str | None = None
) -> dict[str, Any]:
    """The floor: the engine's HTTP calls and tool/verifier work, nothing else.

    With ``env_url`` the episode is a NeMo Gym resources server's: seed, tool, verify and
    close go to its routes. Returns the episodes' finish times and mean per-call seconds.
    """
    import aiohttp
    import orjson

    from rayrollout.data.schema import FunctionCall, Message, Task, ToolCall
    from rayrollout.environments.weather.env import WeatherEnv
    from rayrollout.envkit import Episode

    rows = task_rows(episodes)
    # The row's tools in chat form, as the engine's task reading turns them.
    tools = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
        for t in rows[0]["responses_create_params"]["tools"]
    ]
    semaphore = asyncio.Semaphore(concurrency)
    url = f"{base_url}/chat/completions"
    policy_headers = {"Authorization": "Bearer not-needed", "Content-Type": "application/json"}
    JSON = {"Content-Type": "application/json"}  # noqa: N806  # RemoteSession's, with orjson
    finished: list[float] = []
    seconds = {"model": 0.0, "tools": 0.0, "verify": 0.0, "setup_close": 0.0, "total": 0.0}

    async def ask_policy(
        policy: aiohttp.ClientSession, messages: list[dict[str, Any]], episode_id: str
    ) -> dict[str, Any]:
        """One model call, its body and headers as ``PolicyClient._chat`` sends them."""
        started = time.perf_counter()
        body = {"model": "stub", "messages": messages, "tools": tools, "tool_choice": "auto"}
        async with policy.post(
            url, data=orjson.dumps(body), headers={"x-session-id": episode_id}
        ) as response:
            answer = orjson.loads(await response.read())
        reply = answer["choices"][0]["message"]
        # The engine keeps its own Message and renders it without empty fields.
        message = {k: v for k, v in reply.items() if v is not None}
        messages.append(message)
        seconds["model"] += time.perf_counter() - started
        return message

    async def remote_episode(
        policy: aiohttp.ClientSession, pool: aiohttp.TCPConnector, row: dict[str, Any]
    ) -> float:
        episode_id = f"{row['task_id']}:0:{uuid.uuid4().hex[:8]}"
        rollout = episode_id.replace(":", "_")
        params = row["responses_create_params"]
        seed = {"responses_create_params": params, "task_id": row["task_id"]}
        seed["environment"] = row["environment"]
        began = time.perf_counter()
        async with aiohttp.ClientSession(
            connector=pool,
            connector_owner=False,
            cookie_jar=aiohttp.CookieJar(unsafe=True),
            timeout=aiohttp.ClientTimeout(total=ENV_TIMEOUT_S),
        ) as env:
            async with env.post(
                f"{env_url}/seed_session", data=orjson.dumps(seed), headers=JSON
            ) as response:
                await response.text()
            seconds["setup_close"] += time.perf_counter() - began
            messages: list[dict[str, Any]] = [dict(params["input"][0])]
            output: list[dict[str, Any]] = []
            for turn in range(3):
                message = await ask_policy(policy, messages, episode_id)
                if not message.get("tool_calls"):
                    output.append(
                        {
                            "type": "message",
                            "id": f"msg_{len(messages) - 2}",
                            "role": "assistant",
                            "status": "completed",
                            "content": [
                                {
                                    "type": "output_text",
                                    "text": message["content"],
                                    "annotations": [],
                                }
                            ],
                        }
                    )
                    break
                for k, call in enumerate(message["tool_calls"]):
                    started = time.perf_counter()
                    name, arguments = call["function"]["name"], call["function"]["arguments"]
                    async with env.post(
                        f"{env_url}/{name}", data=orjson.dumps(json.loads(arguments)), headers=JSON
                    ) as response:
                        result = await response.text()
                    seconds["tools"] += time.perf_counter() - started
                    messages.append(
                        {
                            "role": "tool",
                            "content": result,
                            "tool_call_id": call["id"],
                            "name": name,
                        }
                    )
                    output.append(
                        {
                            "type": "function_call",
                            "id": f"fc_{turn}_{k}",
                            "call_id": call["id"],
                            "name": name,
                            "arguments": arguments,
                            "status": "completed",
                        }
                    )
                    output.append(
                        {
                            "type": "function_call_output",
                            "id": f"fco_{len(messages) - 2}",
                            "call_id": call["id"],
                            "output": result,
                            "status": "completed",
                        }
                    )
            started = time.perf_counter()
            response_body = {
                "id": f"resp_{uuid.uuid4().hex}",
                "object": "response",
                "created_at": time.time(),
                "model": "",
                "status": "completed",
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": params["tools"],
            }
            async with env.post(
                f"{env_url}/verify",
                data=orjson.dumps({**seed, "response": response_body}),
                headers=JSON,
            ) as response:
                reward = float(json.loads(await response.text())["reward"])
            closing = time.perf_counter()
            seconds["verify"] += closing - started
            close = {"resources_session_id": rollout, "episode_id": {"rollout_id": rollout}}
            close["episode_id"]["attempt"] = 0
            async with env.post(
                f"{env_url}/close_session", data=orjson.dumps(close), headers=JSON
            ) as response:
                await response.text()
        seconds["setup_close"] += time.perf_counter() - closing
        return reward

    async def inline_episode(
        policy: aiohttp.ClientSession, pool: aiohttp.TCPConnector, row: dict[str, Any]
    ) -> float:
        episode_id = f"{row['task_id']}:0:{uuid.uuid4().hex[:8]}"
        prompt = row["responses_create_params"]["input"][0]["content"]
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        task = Task(
            task_id=row["task_id"],
            environment="weather",
            prompt=[Message(role="user", content=prompt)],
            tools=tools,
        )
        env = WeatherEnv(task)
        await env.setup()
        for _ in range(3):
            message = await ask_policy(policy, messages, episode_id)
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                started = time.perf_counter()
                name = call["function"]["name"]
                result = await env.call_tool(name, call["function"]["arguments"])
                seconds["tools"] += time.perf_counter() - started
                messages.append(
                    {
                        "role": "tool",
                        "content": result.content,
                        "tool_call_id": call["id"],
                        "name": name,
                    }
                )
        started = time.perf_counter()
        calls = [
            ToolCall(id=c["id"], function=FunctionCall(**c["function"]))
            for m in messages
            for c in m.get("tool_calls") or []
        ]
        verdict = await env.verify(
            Episode(
                task=task,
                messages=[
                    Message(role="user", content=prompt),
                    Message(role="assistant", tool_calls=calls or None),
                    Message(role="assistant", content=messages[-1].get("content")),
                ],
            )
        )
        seconds["verify"] += time.perf_counter() - started
        await env.close()
        return verdict.reward

    async def play(
        policy: aiohttp.ClientSession, pool: aiohttp.TCPConnector, row: dict[str, Any]
    ) -> float:
        async with semaphore:
            began = time.perf_counter()
            episode = remote_episode if env_url else inline_episode
            reward = await episode(policy, pool, row)
            seconds["total"] += time.perf_counter() - began
            finished.append(time.time())
            return reward

    # Two pools, as in a worker: the policy's (PolicyHttp) and the environments' (one
    # NemoGymConnections per worker, its sessions made per episode).
    pool = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    policy = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0),
        headers=policy_headers,
        timeout=aiohttp.ClientTimeout(total=120),
    )
    async with policy:
        rewards = await asyncio.gather(*(play(policy, pool, row) for row in rows))
    await pool.close()
    assert sum(rewards) == episodes, "bare loop episodes failed"
    return {
        "finished": finished,
        "seconds_per_episode": {k: v / episodes for k, v in seconds.items()},
    }


def bare_main(base_url: str, episodes: int, concurrency: int, env_url: str | None) -> None:
    """The bare loop's own process (``--bare``): prints its finish times, calls and CPU."""
    result = asyncio.run(bare_loop(base_url, episodes, concurrency, env_url))
    times = os.times()
    result["cpu_s"] = times.user + times.system
    print(json.dumps(result))


def run_bare(
    base_url: str,
    server_pids: list[int],
    episodes: int,
    concurrency: int,
    env_url: str | None = None,
) -> dict[str, Any]:
    """The bare loop in a fresh process, timed from its start to its exit."""
    command = [sys.executable, os.path.abspath(__file__), "--bare", base_url]
    command += ["--episodes", str(episodes), "--concurrency", str(concurrency)]
    command += ["--env-url", env_url] if env_url else []
    servers0 = sum(tree_cpu_seconds(pid) for pid in server_pids)
    start = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    servers = sum(tree_cpu_seconds(pid) for pid in server_pids) - servers0
    result = json.loads(done.stdout)
    return {
        "steady_episodes_per_s": steady_rate(result["finished"]),
        "whole_episodes_per_s": episodes / wall,
        "seconds": wall,
        "cpu_ms_per_episode": 1000 * (result["cpu_s"] + servers) / episodes,
        "client_cpu_ms_per_episode": round(1000 * result["cpu_s"] / episodes, 4),
        "seconds_per_episode": {k: round(v, 5) for k, v in result["seconds_per_episode"].items()},
    }


def run_engine(
    base_url: str,
    server_pids: list[int],
    episodes: int,
    concurrency: int,
    hosting: str,
    num_workers: int,
    env_url: str | None = None,
) -> dict[str, Any]:
    """One engine from construction to shutdown, playing every row once."""
    from rayrollout import RolloutEngine
    from rayrollout.data.episode_table import load_episodes

    out = tempfile.mkdtemp(prefix=f"overhead-{hosting}-")
    if hosting == "url":
        env_name, settings = "weather", {"url": env_url}
    else:
        env_name, settings = HOSTING_CONFIGS.get(hosting, ("weather", {"hosting": hosting}))
    config = {
        "namespace": f"overhead-{hosting}",
        "policy": {"kind": "openai", "base_url": base_url, "model": "stub", "max_retries": 0},
        "environments": {env_name: settings},
        "workers": {"num_workers": num_workers},
        "concurrency": concurrency,
        "output": {"dir": out, "rows_per_part": 5000},
        "ray": {"num_cpus": 4},
    }
    tasks = task_rows(episodes, env_name)
    root = os.getpid()
    processes0 = cpu_by_process([root, *server_pids])
    cpu0 = tree_cpu_seconds(root) + sum(tree_cpu_seconds(pid) for pid in server_pids)
    start = time.perf_counter()
    with RolloutEngine(config) as engine:
        engine.start()
        processes_started = cpu_by_process([root, *server_pids])
        started, collect_at = time.perf_counter(), time.time()
        result = engine.collect(tasks)
        collected, collect_end = time.perf_counter(), time.time()
        # Measured before the actors exit: a dead process's CPU is no longer in /proc.
        cpu = tree_cpu_seconds(root) + sum(tree_cpu_seconds(pid) for pid in server_pids) - cpu0
        processes_end = cpu_by_process([root, *server_pids])
        by_role = cpu_ms_per_episode(processes0, processes_end, episodes)
        in_collect = cpu_ms_per_episode(processes_started, processes_end, episodes)
    ended = time.perf_counter()
    wall = ended - start
    frame = load_episodes(out)
    assert len(frame) == episodes and (frame["status"] == "ok").all(), frame[
        "status"
    ].value_counts()
    assert (frame["reward"] == 1.0).all(), "episodes not played to a correct answer"
    assert (frame["m_tool_calls"] == 1).all(), "episodes without their tool call"
    parts = {k: frame[f"m_seconds_{k}"].mean() for k in ("model", "tools", "verify", "total")}
    parts["other"] = parts["total"] - parts["model"] - parts["tools"] - parts["verify"]
    servers = ("policy stub", "NeMo Gym server")
    return {
        "steady_episodes_per_s": steady_rate(frame["finished_at"].tolist()),
        "whole_episodes_per_s": episodes / wall,
        "seconds": wall,
        "engine_side_cpu_ms_per_episode": round(
            sum(ms for role, ms in by_role.items() if role not in servers), 4
        ),
        "seconds_start": started - start,
        "seconds_collect": collected - started,
        "seconds_shutdown": ended - collected,
        # The collect's time outside its episodes: rows read and checked, an app deployed,
        # the last parts written.
        "seconds_collect_before_first_episode": frame["started_at"].min() - collect_at,
        "seconds_collect_after_last_episode": collect_end - frame["finished_at"].max(),
        "cpu_ms_per_episode": 1000 * cpu / episodes,
        "cpu_ms_per_episode_by_process": by_role,
        # The same over the collect alone (processes up, their imports done): what a process
        # spends per further episode, the figure a per-core ceiling is read from.
        "cpu_ms_per_episode_by_process_in_collect": in_collect,
        # Ray messages between the engine actor and its workers (episodes sent, reports).
        "worker_messages_per_episode": round(result.summary.worker_messages / episodes, 4),
        "seconds_per_episode": {k: round(v, 5) for k, v in parts.items()},
        "share_of_episode_time": {
            k: round(parts[k] / parts["total"], 3) for k in ("model", "tools", "verify", "other")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--modes",
        default="inline,serve,url",
        help="environment hosting modes to run (also: serve-stateful)",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="seconds the stub policy thinks per call (0: a policy that costs nothing)",
    )
    parser.add_argument(
        "--server-cpu-ms",
        type=float,
        default=0.0,
        help="CPU ms each server (stub policy, NeMo Gym server) spends per request besides its "
        "own work, as heavier servers do (0: the cheapest servers, the engine's CPU matters most)",
    )
    parser.add_argument(
        "--nemo-gym-server",
        metavar="NAME",
        help="play the url mode against NeMo Gym 0.7.0's own resources server NAME "
        "(example_single_tool_call: its weather tool), started by its ng_run from "
        ".venv-nemo-gym (bash .ci/nemo_gym builds it), instead of nemo_gym_server.py; "
        "--server-cpu-ms then applies to the stub policy only",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny run to check the benchmark works"
    )
    parser.add_argument("--bare", metavar="POLICY_URL", help=argparse.SUPPRESS)
    parser.add_argument("--env-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare_main(args.bare, args.episodes, args.concurrency, args.env_url)
        return
    keep_stdout_for_json()
    if args.smoke:
        args.episodes, args.concurrency = 100, 32
    # Ray's workers import the serve-stateful environment from this folder.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    start_ray()
    results: dict[str, Any] = {
        "benchmark": "overhead",
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "workers": args.workers,
        "policy_latency_s": args.latency,
        "server_cpu_ms_per_request": args.server_cpu_ms,
        "nemo_gym_server": args.nemo_gym_server or "benchmarks/nemo_gym_server.py",
        "machine": f"{os.cpu_count()} cores",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "steady": f"episodes/s between the {STEADY[0]:.0%} and {STEADY[1]:.0%} finishes",
        "whole": "engine: RolloutEngine construction to shutdown; bare loop: process start to exit",
    }
    try:
        with (
            stub_policy(args.latency, args.server_cpu_ms) as (url, stub_pid),
            (
                nemo_gym_own_server(args.nemo_gym_server)
                if args.nemo_gym_server
                else nemo_gym_weather(args.server_cpu_ms)
            ) as (env_url, env_pid),
        ):
            n, c = args.episodes, args.concurrency
            for mode in args.modes.split(","):
                if mode == "url":
                    key, pids, env = "bare_loop_url", [stub_pid, env_pid], env_url
                else:
                    key, pids, env = "bare_loop_inline", [stub_pid], None
                if key not in results:
                    results[key] = run_bare(url, pids, n, c, env)
                bare = results[key]
                engine = run_engine(url, pids, n, c, mode, args.workers, env_url)
                engine["ratio_steady"] = round(
                    engine["steady_episodes_per_s"] / bare["steady_episodes_per_s"], 3
                )
                engine["ratio_whole"] = round(
                    engine["whole_episodes_per_s"] / bare["whole_episodes_per_s"], 3
                )
                bare_cpu = bare["client_cpu_ms_per_episode"]
                engine["cpu_ratio"] = (  # a smoke run's bare CPU can read 0 clock ticks
                    round(engine["engine_side_cpu_ms_per_episode"] / bare_cpu, 2)
                    if bare_cpu > 0
                    else None
                )
                results[f"engine_{mode}"] = engine
    finally:
        stop_ray()
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    emit(results)


if __name__ == "__main__":
    run_benchmark(main)
