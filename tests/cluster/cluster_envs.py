"""Environments for the cluster tier: a slow one that makes Serve scale its replicas."""

from __future__ import annotations

import asyncio

from rayrollout.envkit import Environment, Episode, Verification, tool


class SlowEnv(Environment):
    """Every tool call takes a second: enough load to scale replicas up during a run."""

    name = "slow"
    default_hosting = "serve"

    @tool
    async def wait(self, text: str) -> str:
        """Wait a second, then echo.

        Args:
            text: What to echo.
        """
        await asyncio.sleep(1.0)
        return text

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=1.0 if episode.final_answer() else 0.0)
