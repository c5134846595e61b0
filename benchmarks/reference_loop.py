"""The reference for ``agent_contract.py``: the episode loop hard-wired, with no agent contract
between the engine and the loop (``rayrollout/engine/episode_frame.py``'s own loop), unchanged but
for this docstring and the names of its limits (``EpisodeConfig``) and of the row's worker
column, so the benchmark compares today's ``tool_loop`` agent with it in one run.

The episode loop: model -> tool calls -> model -> ... -> verifier, as one coroutine.

Everything that can go wrong inside an episode ends here as the trajectory's ``status`` and
``error``; nothing escapes to fail the run. Mistakes of the model (unknown tool, bad JSON
arguments) are answered to the model as tool errors and the episode goes on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from rayrollout.data.config import EpisodeConfig
from rayrollout.data.schema import (
    EpisodeMetrics,
    Message,
    Status,
    Task,
    TimelineEvent,
    Trajectory,
    Turn,
)
from rayrollout.envkit import Environment, Episode
from rayrollout.envkit.sessions import EnvironmentSetupFailed, EnvSession
from rayrollout.policy.call import PolicyRequest
from rayrollout.policy.client import PolicyError, PolicyTimeout
from rayrollout.policy.protocol import Policy
from rayrollout.policy.tokens import first_mismatch

__all__ = ["EpisodeSpec", "run_episode"]


@dataclass
class EpisodeSpec:
    """One unit of work: a task and which of its samples to run."""

    task: Task
    sample_index: int = 0
    queued_at: float = 0.0  # Unix time the engine queued it (0: not through the engine)

    @property
    def key(self) -> tuple[str, int]:
        return (self.task.task_id, self.sample_index)

    def new_episode_id(self) -> str:
        """A unique id for one attempt at this sample (session key for envs and the policy)."""
        return f"{self.task.task_id}:{self.sample_index}:{uuid.uuid4().hex[:8]}"


class _EpisodeEnd(Exception):
    def __init__(self, status: Status, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


async def run_episode(
    spec: EpisodeSpec,
    env_cls: type[Environment],
    session: EnvSession,
    policy: Policy,
    config: EpisodeConfig,
    worker_name: str = "",
    episode_id: str | None = None,
) -> Trajectory:
    """Play one episode to the end and return its trajectory, whatever happens."""
    task = spec.task
    started = time.perf_counter()
    tools = task.tools if task.tools is not None else env_cls.tool_schemas()
    messages: list[Message] = list(task.prompt)
    trajectory = Trajectory(
        task_id=task.task_id,
        sample_index=spec.sample_index,
        group_id=task.task_id,
        environment=task.environment,
        worker=worker_name,
        model=policy.config.model,
        tools=tools,
        task_fields=task.fields,
    )
    metrics = trajectory.metrics
    metrics.started_at = time.time()
    if spec.queued_at:
        metrics.seconds_queued = max(0.0, metrics.started_at - spec.queued_at)
    episode_id = episode_id or spec.new_episode_id()
    is_set_up = False
    try:
        await session.setup()
        is_set_up = True
        answered = await _play(
            task, tools, messages, trajectory, session, policy, config, episode_id
        )
        if not answered:
            trajectory.status = "max_turns"
        elif trajectory.turns and trajectory.turns[-1].finish_reason == "length":
            trajectory.status = "truncated"
        await _verify(task, messages, trajectory, session, config)
    except _EpisodeEnd as end:
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
    trajectory.messages = messages
    metrics.seconds_total = time.perf_counter() - started
    return trajectory


async def _play(
    task: Task,
    tools: list[dict],
    messages: list[Message],
    trajectory: Trajectory,
    session: EnvSession,
    policy: Policy,
    config: EpisodeConfig,
    episode_id: str,
) -> bool:
    """Alternate model calls and tool calls; returns whether the model gave a final answer."""
    metrics = trajectory.metrics
    for turn_index in range(config.max_turns):
        try:
            reply = await policy.complete(
                PolicyRequest(
                    messages,
                    tools,
                    task.sampling,
                    session_id=episode_id,
                    history=trajectory.turns,
                    last_turn=turn_index == config.max_turns - 1,
                )
            )
        except PolicyTimeout as exc:
            raise _EpisodeEnd("timeout", str(exc)) from None
        except PolicyError as exc:
            raise _EpisodeEnd("error", str(exc)) from None
        _check_tokens(trajectory, reply.turn)
        messages.append(reply.message)
        trajectory.turns.append(reply.turn)
        _mark(metrics, "model", "", reply.turn.started_at, reply.turn.seconds)
        metrics.turns += 1
        metrics.tokens_in += reply.turn.prompt_tokens
        metrics.tokens_out += reply.turn.completion_tokens
        metrics.seconds_model += reply.turn.seconds
        if not reply.message.tool_calls:
            return True
        for call in reply.message.tool_calls:
            name = call.function.name
            tool_started = time.perf_counter()
            tool_started_at = time.time()
            try:
                result = await asyncio.wait_for(
                    session.call_tool(name, call.function.arguments), config.tool_timeout_s
                )
            except TimeoutError:
                raise _EpisodeEnd(
                    "timeout", f"tool '{name}' did not answer within {config.tool_timeout_s}s"
                ) from None
            except EnvironmentSetupFailed as exc:  # a Serve session opens with its first call
                raise _EpisodeEnd("error", f"setting up the environment failed: {exc}") from None
            except Exception as exc:
                raise _EpisodeEnd(
                    "error", f"tool '{name}' failed: {type(exc).__name__}: {exc}"
                ) from None
            finally:
                metrics.seconds_tools += time.perf_counter() - tool_started
            _mark(
                metrics,
                "tool",
                name,
                tool_started_at,
                time.time() - tool_started_at,
                ok=not result.is_error,
            )
            metrics.tool_calls += 1
            metrics.tool_errors += result.is_error
            if name not in metrics.tools_used:
                metrics.tools_used.append(name)
            messages.append(
                Message(role="tool", tool_call_id=call.id, name=name, content=result.content)
            )
    return False


def _mark(
    metrics: EpisodeMetrics,
    kind: Literal["model", "tool", "verify"],
    name: str,
    started_at: float,
    seconds: float,
    ok: bool = True,
) -> None:
    """Add a step to the episode's timeline (offsets from the episode's start)."""
    metrics.timeline.append(
        TimelineEvent(
            kind=kind, name=name, start_s=started_at - metrics.started_at, seconds=seconds, ok=ok
        )
    )


def _check_tokens(trajectory: Trajectory, turn: Turn) -> None:
    """Record whether this turn's prompt ids extend the previous prompt + completion ids."""
    if not trajectory.turns or not turn.prompt_token_ids:
        return
    previous = trajectory.turns[-1]
    if not previous.prompt_token_ids:
        return
    at = first_mismatch(
        previous.prompt_token_ids + previous.completion_token_ids, turn.prompt_token_ids
    )
    if at is None:
        return
    turn.token_mismatch_index = at
    metrics = trajectory.metrics
    metrics.token_mismatches += 1
    if metrics.token_mismatch_turn is None:
        metrics.token_mismatch_turn, metrics.token_mismatch_index = len(trajectory.turns), at


async def _verify(
    task: Task,
    messages: list[Message],
    trajectory: Trajectory,
    session: EnvSession,
    config: EpisodeConfig,
) -> None:
    verify_started = time.perf_counter()
    verify_started_at = time.time()
    try:
        verification = await asyncio.wait_for(
            session.verify(Episode(task=task, messages=messages)), config.verify_timeout_s
        )
    except TimeoutError:
        raise _EpisodeEnd(
            "timeout", f"verifier did not answer within {config.verify_timeout_s}s"
        ) from None
    except EnvironmentSetupFailed as exc:
        raise _EpisodeEnd("error", f"setting up the environment failed: {exc}") from None
    except Exception as exc:
        raise _EpisodeEnd("error", f"verifier failed: {type(exc).__name__}: {exc}") from None
    finally:
        trajectory.metrics.seconds_verify = time.perf_counter() - verify_started
    _mark(trajectory.metrics, "verify", "", verify_started_at, trajectory.metrics.seconds_verify)
    trajectory.reward = verification.reward
    trajectory.verification = verification.details


def failed_trajectory(spec: EpisodeSpec, worker_name: str, error: str) -> Trajectory:
    """The row of an episode that could not even start."""
    task = spec.task
    return Trajectory(
        task_id=task.task_id,
        sample_index=spec.sample_index,
        group_id=task.task_id,
        environment=task.environment,
        worker=worker_name,
        messages=list(task.prompt),
        status="error",
        error=error,
        task_fields=task.fields,
    )
