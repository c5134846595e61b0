"""Weather: the smallest useful environment, and the one to copy when writing a new one.

The task is "What's the weather like in <City>?". The model earns reward 1.0 by calling
``get_weather`` at all (NeMo Gym's example rule): it checks tool use, not the answer text.
"""

from __future__ import annotations

import hashlib

from rayrollout.envkit import Environment, Episode, ToolError, Verification, tool

_CONDITIONS = ("sunny", "partly cloudy", "cloudy", "light rain", "heavy rain", "fog", "windy")


class WeatherEnv(Environment):
    """Answers weather questions with a deterministic, made-up weather report."""

    name = "weather"
    default_hosting = "inline"  # the tool is a hash: no I/O, nothing worth a Serve hop

    @tool
    async def get_weather(self, city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name, e.g. "Paris" or "New York".
        """
        place = " ".join(city.split())
        if not place:
            raise ToolError('the city is empty: pass a city name, e.g. {"city": "Paris"}')
        # A hash rather than randomness: the same city always gets the same report, so
        # rollouts are reproducible and tests can compare runs.
        digest = hashlib.sha256(place.lower().encode()).digest()
        celsius = digest[0] % 41 - 5
        condition = "snow" if celsius <= 0 else _CONDITIONS[digest[1] % len(_CONDITIONS)]
        return f"The weather in {place} is {condition}, {celsius} °C."

    async def verify(self, episode: Episode) -> Verification:
        """Reward 1.0 when the model called ``get_weather`` at least once, else 0.0."""
        called = [call.function.name for call in episode.tool_calls()]
        return Verification(
            reward=1.0 if "get_weather" in called else 0.0, details={"tools_called": called}
        )
