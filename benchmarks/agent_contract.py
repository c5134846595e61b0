"""The agent contract's cost on the built-in loop: today's ``tool_loop`` agent against the
loop it replaced (the episode loop as it was hard-wired in ``engine/episode.py`` before
agents were pluggable, kept unchanged in ``reference_loop.py``), in one run.

Both play the same single-tool weather episodes (chat -> get_weather -> chat -> verify)
through the same ``PolicyClient`` against the same zero-latency OpenAI-protocol stub (its own
process) with the environment inline, in one process and one event loop, no Ray: what
differs is only the agent layer (``AgentEpisode``'s recording, the registry-built agent, the
episode time limit). Rounds alternate between the two so a machine whose load drifts
charges both alike; the ratio is contract episodes/s over reference episodes/s, with CPU
ms per episode of this process for each.

    python benchmarks/agent_contract.py            # 6 rounds x 2,000 episodes, 128 in flight
    python benchmarks/agent_contract.py --smoke    # seconds; CI checks it still works
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import reference_loop  # noqa: E402
from common import emit, keep_stdout_for_json, stub_policy  # noqa: E402
from result_files import run_benchmark  # noqa: E402

from rayrollout.data.config import RunConfig  # noqa: E402
from rayrollout.data.schema import Message, Task, Trajectory  # noqa: E402
from rayrollout.engine.episode_frame import run_episode  # noqa: E402
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.envkit.registry import load_environment  # noqa: E402
from rayrollout.envkit.sessions import InlineSession  # noqa: E402
from rayrollout.policy.client import PolicyClient  # noqa: E402


async def reference_episode(
    spec: EpisodeSpec, env_cls: Any, policy: PolicyClient, config: RunConfig
) -> Any:
    """The loop before agents were pluggable (``reference_loop.py``)."""
    session = InlineSession(env_cls, spec.task, {})
    return await reference_loop.run_episode(spec, env_cls, session, policy, config.episode)


async def contract_episode(
    spec: EpisodeSpec, env_cls: Any, policy: PolicyClient, config: RunConfig
) -> Trajectory:
    """Today's path: ``run_episode`` with the registered ``tool_loop`` agent."""
    session = InlineSession(env_cls, spec.task, {})
    return await run_episode(spec, env_cls, session, policy, config.episode)


async def one_round(
    kind: str, episodes: int, concurrency: int, policy: PolicyClient, config: RunConfig
) -> dict[str, float]:
    env_cls = load_environment("weather")
    specs = [
        EpisodeSpec(
            Task(
                task_id=f"{kind}{i}",
                environment="weather",
                prompt=[Message(role="user", content=f"What's the weather like in City {i}?")],
            )
        )
        for i in range(episodes)
    ]
    slots = asyncio.Semaphore(concurrency)
    rewards: list[float] = []

    async def play(spec: EpisodeSpec) -> None:
        async with slots:
            if kind == "reference":
                trajectory = await reference_episode(spec, env_cls, policy, config)
            else:
                trajectory = await contract_episode(spec, env_cls, policy, config)
            rewards.append(trajectory.reward)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(play(spec) for spec in specs))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if len(rewards) != episodes or min(rewards) < 1.0:
        raise RuntimeError(f"{kind}: {len(rewards)} episodes, rewards {set(rewards)}")
    return {"episodes_per_s": episodes / wall, "cpu_ms_per_episode": 1000 * cpu / episodes}


async def measure(base_url: str, rounds: int, episodes: int, concurrency: int) -> dict[str, Any]:
    config = RunConfig.model_validate(
        {"policy": {"kind": "openai", "base_url": base_url, "model": "stub", "max_retries": 0}}
    )
    policy = PolicyClient(config.policy, base_url, concurrency + 16)
    results: dict[str, list[dict[str, float]]] = {"reference": [], "contract": []}
    try:
        await one_round("reference", min(episodes, 200), concurrency, policy, config)  # warm-up
        await one_round("contract", min(episodes, 200), concurrency, policy, config)
        for index in range(rounds):
            order = ("reference", "contract") if index % 2 == 0 else ("contract", "reference")
            for kind in order:
                results[kind].append(await one_round(kind, episodes, concurrency, policy, config))
    finally:
        await policy.close()

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in results[kind])

    ratios = [
        c["episodes_per_s"] / r["episodes_per_s"]
        for r, c in zip(results["reference"], results["contract"], strict=True)
    ]
    return {
        "benchmark": "agent_contract",
        "episodes_per_round": episodes,
        "rounds": rounds,
        "concurrency": concurrency,
        "reference_episodes_per_s": round(median("reference", "episodes_per_s"), 1),
        "contract_episodes_per_s": round(median("contract", "episodes_per_s"), 1),
        "ratio_contract_over_reference": round(statistics.median(ratios), 3),
        "ratio_per_round": [round(x, 3) for x in ratios],
        "reference_cpu_ms_per_episode": round(median("reference", "cpu_ms_per_episode"), 3),
        "contract_cpu_ms_per_episode": round(median("contract", "cpu_ms_per_episode"), 3),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.episodes, args.concurrency = 2, 60, 16
    keep_stdout_for_json()
    with stub_policy() as (base_url, _pid):
        emit(asyncio.run(measure(base_url, args.rounds, args.episodes, args.concurrency)))


if __name__ == "__main__":
    run_benchmark(main)
