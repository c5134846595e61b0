"""The weather environment with per-episode state, for the ``serve-stateful`` overhead mode.

State makes the engine keep a session per episode on one Serve replica (consistent-hash
routing by episode id), so each tool call and verify is its own handle call: the costliest
way to host an environment, measured next to the stateless ``serve`` mode.
"""

from __future__ import annotations

from rayrollout.environments.weather.env import WeatherEnv
from rayrollout.envkit import ToolResult


class StatefulWeather(WeatherEnv):
    """Counts its tool calls per episode; otherwise the weather environment unchanged."""

    async def setup(self) -> None:
        self.calls = 0

    async def call_tool(self, name: str, arguments: str) -> ToolResult:
        self.calls += 1
        return await super().call_tool(name, arguments)
