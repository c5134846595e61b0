"""Small environments for engine tests: one that echoes, one whose tool crashes, one with state."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from rayrollout.data.schema import Task
from rayrollout.envkit import Environment, Episode, Verification, tool


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


class PickyCounterEnv(CounterEnv):
    """A counter whose setup fails for a task with ``refuse`` set (a bad seed, a missing
    database): the failure must read as setup, wherever the session opens."""

    name = "picky-counter"

    async def setup(self) -> None:
        if self.task.fields.get("refuse"):
            raise ValueError(f"no database for task {self.task.task_id}")
        await super().setup()


class ScheduledRewardEnv(EchoEnv):
    """Rewards from the task's ``rewards`` list, in turn per task (in this process), so a
    group's rewards are known in advance; run it inline on one agent. Training-loop tests."""

    name = "scheduled"
    verified: ClassVar[dict[str, int]] = {}

    async def verify(self, episode: Episode) -> Verification:
        rewards = episode.task.fields["rewards"]
        task_id = episode.task.task_id
        count = ScheduledRewardEnv.verified.get(task_id, 0)
        ScheduledRewardEnv.verified[task_id] = count + 1
        return Verification(reward=rewards[count % len(rewards)])


class SleepyEnv(EchoEnv):
    """Its verifier takes the task's ``sleep_s`` seconds: a slow episode among fast ones."""

    name = "sleepy"

    async def verify(self, episode: Episode) -> Verification:
        await asyncio.sleep(float(episode.task.fields.get("sleep_s", 0.0)))
        return await super().verify(episode)


class GreeterEnv(Environment):
    """Built with a keyword argument (the config's ``environments.NAME.args``): its tool and
    verifier show which greeting it got, wherever it was built (an answer that opens with
    the greeting scores 1). Its class ``name`` differs
    from the names tests register it under, which is what they decide by."""

    name = "greeter"

    def __init__(self, task: Task, *, greeting: str = "hello") -> None:
        super().__init__(task)
        self.greeting = greeting

    @tool
    async def greet(self, who: str) -> str:
        """Greet someone.

        Args:
            who: Whom to greet.
        """
        return f"{self.greeting}, {who}"

    async def verify(self, episode: Episode) -> Verification:
        reward = 1.0 if episode.final_answer().startswith(self.greeting) else 0.0
        return Verification(reward=reward, details={"greeting": self.greeting})


class NemoGymPlayedEnv(EchoEnv):
    """Declares the ``nemo_gym`` agent as its default: a run that leaves the agent to it
    must give that agent's settings (its ``url`` and ``gateway_port``)."""

    default_agent = "nemo_gym"
