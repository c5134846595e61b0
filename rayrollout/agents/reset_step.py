"""The reset/step agent: plays any environment of the reset/step kind (skyrl-gym, GEM,
OpenEnv, NeMo Gym's Gymnasium-style servers). It is those environments' declared default
(``Environment.default_agent``), so a row that names one of them needs no ``agent``.

reset -> model -> its reply as the action -> step -> the observation as the next user turn
-> model ... until the environment says terminated or truncated, or the episode is out of
policy calls (``max_turns``, the environment's own turn limit where it declares one and the
config sets none, asked again after reset: the verifier still runs). Each call sends the
whole transcript,
so every turn extends the one before: the episode is one token sequence. The model is
offered the tools the environment's reset names (an OpenEnv MCP environment's), else none:
most of these environments read actions from the reply's text.

What it records: every step's reward on the policy turn whose reply was the action
(``Turn.step_reward``), for credit assignment; the episode's reward is the environment's
verdict, the sum of its step rewards unless it says otherwise (``ResetStepEnvironment``),
with the step rewards, the ending and the last observation in the row's ``verification``.
Resets and steps are timed in the timeline (``step reset``, ``step step``) and in
``seconds_tools``, each within ``tool_timeout_s``; the tool calls of a reply the environment
steps with (an MCP environment's) count in ``tool_calls`` and ``tools_used``. What the
environment says when the episode ends is not put in the transcript (the model never reads
it).

Faults: an environment that fails in reset or step ends the episode ``error`` naming the
source and its id; one past ``tool_timeout_s`` ends it ``timeout``. An environment that is
not of the reset/step kind, or is hosted on Serve (its instance is on a replica), ends the
episode ``error`` saying so. Example row (GEM)::

    {"prompt": [{"role": "system", "content": "Put your guess in \\\\boxed{}."}],
     "environment": "gem", "env_id": "game:GuessTheNumber-v0-easy", "seed": 3}
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from rayrollout.agentkit import Agent, AgentEpisode, EpisodeEnd
from rayrollout.data.schema import Message, TimelineEvent
from rayrollout.envkit.contract import episode_limits
from rayrollout.envkit.reset_step import ResetStepError, reset_step_session

T = TypeVar("T")
_NAME = "reset_step"


class ResetStep(Agent):
    """Reset the environment, then step it with each reply until it ends."""

    async def play(self, episode: AgentEpisode) -> None:
        environment = reset_step_session(episode.session)
        if environment is None:
            raise EpisodeEnd(
                "error",
                f"agent '{_NAME}': environment '{episode.task.environment}' cannot be stepped "
                "here: it is not a reset/step environment (skyrl_gym, gem, openenv), or it is "
                "hosted on Serve (reset/step environments run inline: hosting: inline)",
            )
        opening = await _timed(episode, "reset", environment.reset(list(episode.messages)))
        episode.messages[:] = opening.messages
        # A game may draw its size, and so its turn limit, when it is reset.
        episode.limits = episode_limits(episode.limits, environment)
        if opening.tools:  # the environment's own tools (OpenEnv's MCP ones), as recorded
            episode.trajectory.tools = opening.tools
        while True:
            # raises OutOfTurns past max_turns
            reply = await episode.model(tools=opening.tools)
            episode.messages.append(reply)
            result = await _timed(episode, "step", environment.step(reply))
            episode.trajectory.turns[-1].step_reward = result.reward  # the call just made
            _count_tool_calls(episode, reply)
            if result.ended:
                return
            episode.messages.extend(result.observation)


def _count_tool_calls(episode: AgentEpisode, reply: Message) -> None:
    """The reply's tool calls, which the environment ran as its step, in the episode's
    ``tool_calls`` and ``tools_used`` (as the tool loop counts the calls it runs)."""
    metrics = episode.trajectory.metrics
    for call in reply.tool_calls or []:
        metrics.tool_calls += 1
        if call.function.name not in metrics.tools_used:
            metrics.tools_used.append(call.function.name)


async def _timed(episode: AgentEpisode, what: str, call: Awaitable[T]) -> T:
    """``call`` within ``tool_timeout_s``, timed into the metrics and the timeline; its
    failure as the episode's end."""
    metrics = episode.trajectory.metrics
    limit = episode.limits.tool_timeout_s
    started, started_at, ok = time.perf_counter(), time.time(), False
    try:
        async with asyncio.timeout(limit):
            answer = await call
        ok = True
        return answer
    except TimeoutError:
        raise EpisodeEnd(
            "timeout",
            f"environment '{episode.task.environment}' did not answer {what} within {limit}s",
        ) from None
    except ResetStepError as exc:
        raise EpisodeEnd("error", str(exc)) from None
    except Exception as exc:
        raise EpisodeEnd(
            "error",
            f"environment '{episode.task.environment}' failed in {what}: "
            f"{type(exc).__name__}: {exc}",
        ) from None
    finally:
        seconds = time.perf_counter() - started
        metrics.seconds_tools += seconds
        metrics.timeline.append(
            TimelineEvent(
                kind="step",
                name=what,
                start_s=started_at - metrics.started_at,
                seconds=seconds,
                ok=ok,
            )
        )
