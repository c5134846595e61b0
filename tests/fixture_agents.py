"""Agents that misbehave, for the engine's fault tests (imported by module path in actors)."""

from __future__ import annotations

import asyncio
from typing import Any

from rayrollout.agentkit import Agent, AgentEpisode


class Raises(Agent):
    """Asks the model once, then breaks."""

    async def play(self, episode: AgentEpisode) -> None:
        episode.messages.append(await episode.model())
        raise ValueError("the harness lost its place")


class Hangs(Agent):
    """Never returns."""

    async def play(self, episode: AgentEpisode) -> None:
        await asyncio.Event().wait()


class Garbage(Agent):
    """Returns something that is not a verdict."""

    async def play(self, episode: AgentEpisode) -> Any:
        return {"reward": 1.0}


async def answer_once(episode: AgentEpisode, suffix: str = "") -> None:
    """An agent as one function: one model call without tools."""
    reply = await episode.model(tools=[])
    if suffix:
        reply = reply.model_copy(update={"content": f"{reply.content}{suffix}"})
    episode.messages.append(reply)
