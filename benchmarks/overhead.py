"""Engine overhead: rayrollout against a bare asyncio + aiohttp loop making the same calls.

Both drive the same zero-latency OpenAI-protocol stub (its own process) through single-tool
weather episodes (model call -> get_weather -> model call -> verifier). The bare loop runs
everything in one process with no Ray, no validation and no output; the engine runs its
agents, environments and writer (Parquet). Reported: episodes/s of each, their ratio, and CPU
milliseconds per episode summed over every process of the run (the stub included in both).

Hosting modes: ``inline`` (the environment in the agents), ``serve`` (Serve replicas, called
by deployment handles), ``serve-stateful`` (the same with per-episode state,
``stateful_weather.py``: a session per episode pinned to one replica, so no call batching)
and ``remote`` (a NeMo Gym resources server by URL: a plain aiohttp server in its own
process, ``nemo_gym_server.py``). For ``remote`` the bare loop makes the
same HTTP calls to the same server (seed, tool, verify, close), and the ratio is to that.

    python benchmarks/overhead.py                 # full run (about 2.5 minutes here)
    python benchmarks/overhead.py --smoke         # seconds; CI checks it still works
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import (  # noqa: E402
    cpu_by_role,
    cpu_ms_per_episode,
    emit,
    keep_stdout_for_json,
    nemo_gym_weather,
    start_ray,
    stop_ray,
    stub_policy,
    tree_cpu_seconds,
)

PROMPT = "What's the weather like in City {i}?"
# Modes that are more than a hosting name: (the config entry, which the tasks name; its
# settings). A class other than the registered one needs a name of its own.
HOSTING_CONFIGS = {
    "serve-stateful": (
        "weather_stateful",
        {"path": "stateful_weather:StatefulWeather", "hosting": "serve"},
    ),
}


async def bare_loop(
    base_url: str, episodes: int, concurrency: int, env_url: str | None = None
) -> None:
    """The floor: the same HTTP calls and tool/verifier work, nothing else.

    With ``env_url`` the tool and the verifier are a NeMo Gym resources server's routes.
    """
    import aiohttp
    from rayrollout.environments.weather.env import WeatherEnv

    from rayrollout.data.convert import chat_tools_to_responses
    from rayrollout.data.schema import FunctionCall, Message, Task, ToolCall
    from rayrollout.environment import Episode

    tools = WeatherEnv.tool_schemas()
    response_tools = chat_tools_to_responses(tools)
    semaphore = asyncio.Semaphore(concurrency)
    url = f"{base_url}/chat/completions"

    async def ask_policy(
        session: aiohttp.ClientSession, messages: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """One model call of either kind of episode; its message joins ``messages``."""
        async with session.post(
            url, json={"model": "stub", "messages": messages, "tools": tools}
        ) as response:
            body = await response.json()
        message = body["choices"][0]["message"]
        messages.append(message)
        return message

    async def remote_episode(session: aiohttp.ClientSession, i: int) -> float:
        async with semaphore:
            prompt = {"role": "user", "content": PROMPT.format(i=i)}
            params = {"input": [prompt], "tools": response_tools}
            async with session.post(
                f"{env_url}/seed_session", json={"responses_create_params": params}
            ) as response:
                cookie = {"Cookie": f"session={response.cookies['session'].value}"}
            messages: list[dict[str, Any]] = [prompt]
            output: list[dict[str, Any]] = []
            for _ in range(3):
                message = await ask_policy(session, messages)
                if not message.get("tool_calls"):
                    output.append(
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": message["content"]}],
                        }
                    )
                    break
                for call in message["tool_calls"]:
                    name, arguments = call["function"]["name"], call["function"]["arguments"]
                    async with session.post(
                        f"{env_url}/{name}", data=arguments, headers=cookie
                    ) as response:
                        result = await response.text()
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                    output.append(
                        {
                            "type": "function_call",
                            "call_id": call["id"],
                            "name": name,
                            "arguments": arguments,
                        }
                    )
                    output.append(
                        {"type": "function_call_output", "call_id": call["id"], "output": result}
                    )
            verify_body = {"responses_create_params": params, "response": {"output": output}}
            async with session.post(
                f"{env_url}/verify", json=verify_body, headers=cookie
            ) as response:
                reward = (await response.json())["reward"]
            async with session.post(f"{env_url}/close_session", json={}, headers=cookie):
                pass
            return reward

    async def episode(session: aiohttp.ClientSession, i: int) -> float:
        async with semaphore:
            messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT.format(i=i)}]
            task = Task(
                task_id=str(i),
                environment="weather",
                prompt=[Message(role="user", content=messages[0]["content"])],
            )
            env = WeatherEnv(task)
            for _ in range(3):
                message = await ask_policy(session, messages)
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    result = await env.call_tool(
                        call["function"]["name"], call["function"]["arguments"]
                    )
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": result.content}
                    )
            calls = [
                ToolCall(id=c["id"], function=FunctionCall(**c["function"]))
                for m in messages
                for c in m.get("tool_calls") or []
            ]
            verdict = await env.verify(
                Episode(
                    task=task,
                    messages=[
                        Message(role="user", content=messages[0]["content"]),
                        Message(role="assistant", tool_calls=calls or None),
                        Message(role="assistant", content=messages[-1].get("content")),
                    ],
                )
            )
            return verdict.reward

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        play = remote_episode if env_url else episode
        rewards = await asyncio.gather(*(play(session, i) for i in range(episodes)))
    assert sum(rewards) == episodes, "bare loop episodes failed"


def run_bare(
    base_url: str,
    server_pids: list[int],
    episodes: int,
    concurrency: int,
    env_url: str | None = None,
) -> dict[str, float]:
    warm_up = bare_loop(base_url, min(200, episodes), concurrency, env_url)
    asyncio.run(warm_up)  # connections, imports: not timed
    cpu0 = time.process_time() + sum(tree_cpu_seconds(pid) for pid in server_pids)
    start = time.perf_counter()
    asyncio.run(bare_loop(base_url, episodes, concurrency, env_url))
    wall = time.perf_counter() - start
    cpu = time.process_time() + sum(tree_cpu_seconds(pid) for pid in server_pids) - cpu0
    return {
        "episodes_per_s": episodes / wall,
        "cpu_ms_per_episode": 1000 * cpu / episodes,
        "seconds": wall,
    }


def run_engine(
    base_url: str,
    server_pids: list[int],
    episodes: int,
    concurrency: int,
    hosting: str,
    num_agents: int,
    env_url: str | None = None,
) -> dict[str, float]:
    import pandas as pd

    from rayrollout import RolloutEngine

    out = tempfile.mkdtemp(prefix=f"overhead-{hosting}-")
    if hosting == "remote":
        env_name, settings = "weather", {"url": env_url}
    else:
        env_name, settings = HOSTING_CONFIGS.get(hosting, ("weather", {"hosting": hosting}))
    config = {
        "namespace": f"overhead-{hosting}",
        "policy": {"kind": "openai", "base_url": base_url, "model": "stub", "max_retries": 0},
        "environments": {env_name: settings},
        "agents": {"num_agents": num_agents},
        "concurrency": concurrency,
        "output": {"dir": out, "rows_per_part": 5000},
        "ray": {"num_cpus": 4},
    }
    tasks = [
        {"task_id": f"w{i}", "prompt": PROMPT.format(i=i), "environment": env_name}
        for i in range(episodes)
    ]
    warm_up = [{**t, "task_id": f"warm-{t['task_id']}"} for t in tasks[: min(200, episodes)]]
    with RolloutEngine(config) as engine:
        engine.start()
        engine.collect(warm_up)  # worker processes, connections, the Serve app: not timed
        root = os.getpid()
        roles0 = cpu_by_role([root, *server_pids])
        cpu0 = tree_cpu_seconds(root) + sum(tree_cpu_seconds(pid) for pid in server_pids)
        start = time.perf_counter()
        result = engine.collect(tasks)
        wall = time.perf_counter() - start
        cpu = tree_cpu_seconds(root) + sum(tree_cpu_seconds(pid) for pid in server_pids) - cpu0
        by_role = cpu_ms_per_episode(roles0, cpu_by_role([root, *server_pids]), episodes)
    frame = pd.read_parquet([str(p) for p in result.parts], columns=["task_id", "status"])
    assert len(frame) == episodes and (frame["status"] == "ok").all(), frame[
        "status"
    ].value_counts()
    return {
        "episodes_per_s": episodes / wall,
        "cpu_ms_per_episode": 1000 * cpu / episodes,
        "cpu_ms_per_episode_by_process": by_role,
        "seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument(
        "--modes",
        default="inline,serve,serve-stateful,remote",
        help="environment hosting modes to run",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny run to check the benchmark works"
    )
    args = parser.parse_args()
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
        "agents": args.agents,
        "machine": f"{os.cpu_count()} cores",
    }
    try:
        with stub_policy() as (url, stub_pid), nemo_gym_weather() as (env_url, env_pid):
            n, c = args.episodes, args.concurrency
            results["bare_loop"] = run_bare(url, [stub_pid], n, c)
            for mode in args.modes.split(","):
                if mode == "remote":
                    bare = results["bare_loop_remote"] = run_bare(
                        url, [stub_pid, env_pid], n, c, env_url
                    )
                    pids = [stub_pid, env_pid]
                else:
                    bare, pids = results["bare_loop"], [stub_pid]
                engine = run_engine(url, pids, n, c, mode, args.agents, env_url)
                engine["ratio_to_bare"] = engine["episodes_per_s"] / bare["episodes_per_s"]
                results[f"engine_{mode}"] = engine
    finally:
        stop_ray()
    emit(results)


if __name__ == "__main__":
    main()
