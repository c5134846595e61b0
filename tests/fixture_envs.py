"""Small environments for engine tests: one that echoes, one whose tool crashes, one with state."""

from __future__ import annotations

from rayrollout.environment import Environment, Episode, Verification, tool


class EchoEnv(Environment):
    name = "echo"

    @tool
    async def echo(self, text: str) -> str:
        """Repeat the text back.

        Args:
            text: What to repeat.
        """
        return text

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=1.0 if episode.final_answer() else 0.0)


class FaultyEnv(Environment):
    name = "faulty"

    @tool
    async def explode(self, text: str) -> str:
        """A tool with a bug: it always raises.

        Args:
            text: Ignored.
        """
        raise RuntimeError(f"boom on {text!r}")

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=1.0)


class CounterEnv(Environment):
    """Stateful: counts tool calls per episode; served on replicas to test session affinity."""

    name = "counter"
    default_hosting = "serve"
    opened = 0

    async def setup(self) -> None:
        self.count = 0

    @tool
    async def bump(self, text: str) -> str:
        """Add one to this episode's counter.

        Args:
            text: Ignored.
        """
        self.count += 1
        return str(self.count)

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=1.0 if self.count == 1 else 0.0, details={"count": self.count})
