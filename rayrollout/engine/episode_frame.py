"""One episode: the environment session around an agent's ``play``, then the verifier.

The agent decides the loop; this module owns the session's setup and close, the time limit,
and the mapping of every failure (the agent's own included) to the trajectory's ``status``
and ``error``, so nothing escapes to fail the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rayrollout.agentkit import POLICY, Agent, AgentEpisode, EpisodeEnd, OutOfTurns
from rayrollout.agentkit.episode import GatewayOpener
from rayrollout.agentkit.registry import agent_spec
from rayrollout.data.config import DEFAULT_AGENT, EpisodeConfig
from rayrollout.data.schema import Trajectory
from rayrollout.engine.episode_spec import EpisodeSpec, spec_row
from rayrollout.envkit import Environment, Verification
from rayrollout.envkit.contract import episode_limits
from rayrollout.envkit.sessions import EnvSession
from rayrollout.policy.protocol import Policy

__all__ = ["run_episode"]

# The built-in loop, for callers that name no agent (tests, benchmarks of the bare loop).
_TOOL_LOOP: Agent = agent_spec(DEFAULT_AGENT).create()


async def run_episode(
    spec: EpisodeSpec,
    env_cls: type[Environment],
    session: EnvSession,
    policy: Policy,
    limits: EpisodeConfig,
    worker_name: str = "",
    episode_id: str | None = None,
    agent: Agent | None = None,
    played_by: str = DEFAULT_AGENT,
    gateway: GatewayOpener | None = None,
    on_played: Callable[[], None] | None = None,
) -> Trajectory:
    """Have ``agent`` (default: the built-in tool loop) play one episode to the end, within
    ``limits``, and return its trajectory, whatever happens. ``worker_name`` is the worker
    actor playing it (the row's ``worker``; '' outside a worker). ``on_played`` is called
    once the agent's loop is over (its last model call answered), before the verifier runs
    and the session closes: a worker gives the episode's running slot to the next episode
    there, so the policy is not left a request short while this one is scored."""
    task = spec.task
    started = time.perf_counter()
    tools = task.tools if task.tools is not None else env_cls.tool_schemas()
    trajectory = spec_row(spec, worker_name, played_by, model=policy.config.model, tools=tools)
    metrics = trajectory.metrics
    metrics.started_at = time.time()
    if spec.queued_at:
        metrics.seconds_queued = max(0.0, metrics.started_at - spec.queued_at)
    episode = AgentEpisode(
        task,
        tools,
        session,
        policy,
        limits,
        trajectory,
        episode_id or spec.new_episode_id(),
        gateway,
    )
    is_set_up = False
    try:
        await session.setup()
        is_set_up = True
        episode.limits = episode_limits(limits, session)  # the environment's own turn limit
        try:
            verdict = await _play(agent or _TOOL_LOOP, played_by, episode, limits)
        finally:
            if on_played is not None:
                on_played()
        if verdict is None:
            verdict = await episode.verify()
        trajectory.reward = verdict.reward
        trajectory.verification = verdict.details
    except EpisodeEnd as end:
        trajectory.status, trajectory.error = end.status, end.error
    except Exception as exc:  # an environment bug must not end the run: record it
        where = "setting up the environment" if not is_set_up else "the episode"
        trajectory.status = "error"
        trajectory.error = f"{where} failed: {type(exc).__name__}: {exc}"
    finally:
        try:
            await session.close()
        except Exception as exc:
            # The episode is over and scored (or failed for its own reason): a session that
            # would not close is the server's leak, not a wrong reward, so it is recorded and
            # counted beside the status instead of replacing it.
            trajectory.close_error = f"{type(exc).__name__}: {exc}"
    trajectory.messages = episode.messages
    metrics.seconds_total = time.perf_counter() - started
    return trajectory


async def _play(
    agent: Agent, played_by: str, episode: AgentEpisode, limits: EpisodeConfig
) -> Verification | None:
    """The agent's ``play``, its faults as the episode's status; sets ``max_turns`` and
    ``truncated`` (the verifier still runs for both) and returns the agent's own verdict."""
    trajectory = episode.trajectory
    try:
        # asyncio.timeout, not wait_for: wait_for wraps the call in a task of its own, a
        # measurable share of a worker's CPU at thousands of episodes a second.
        async with asyncio.timeout(limits.timeout_s):
            verdict = await agent.play(episode)
    except OutOfTurns:
        trajectory.status = "max_turns"
        return None
    except EpisodeEnd:
        raise
    except TimeoutError:
        raise EpisodeEnd(
            "timeout", f"agent '{played_by}' did not finish within {limits.timeout_s}s"
        ) from None
    except Exception as exc:
        raise EpisodeEnd(
            "error", f"agent '{played_by}' failed: {type(exc).__name__}: {exc}"
        ) from None
    if verdict is not None and not isinstance(verdict, Verification):
        raise EpisodeEnd(
            "error",
            f"agent '{played_by}' returned {type(verdict).__name__}; play() returns None or "
            "a Verification",
        )
    policy_turns = [t for t in trajectory.turns if t.speaker == POLICY]
    if policy_turns and policy_turns[-1].finish_reason == "length":
        trajectory.status = "truncated"
    return verdict
