"""``ResetStepEnvironment``: the base of reset/step sources that run in this process.

A source library's environment is synchronous (skyrl-gym's and GEM's ``make``, ``reset``,
``step`` and ``close`` are plain functions, some of them slow: a SQL query, a sandbox), so
every call runs in a worker thread (``asyncio.to_thread``) and the worker's event loop keeps
playing its other episodes meanwhile. One instance is one episode's session: ``setup`` makes
the library's environment, ``close`` (run after every episode, failed ones included) closes
it.

Every step's reward is kept; the episode's reward (``verify``) is their sum unless a source
overrides ``episode_reward``. Nothing is clipped: rewards are any finite float, and a reward
that is not one (NaN, infinity, not a number) fails the step, naming the source.

A subclass names its ``source`` and implements the four synchronous calls (``make``,
``start``, ``advance``, ``shut``); see ``skyrl_gym`` and ``gem``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
from typing import Any, ClassVar

from pydantic import ValidationError

from rayrollout.data.schema import Message, Task
from rayrollout.data.validation import problem_text
from rayrollout.environment.contract import Environment, Episode, Verification
from rayrollout.environment.reset_step.protocol import (
    Opening,
    ResetStepError,
    StepResult,
    step_details,
)

__all__ = ["ResetStepEnvironment", "chat_messages"]


class ResetStepEnvironment(Environment):
    """An environment played by reset and step (the ``reset_step`` agent), in this process.

    Class attributes:
        source: The library's name, as errors and ``details`` name it ('skyrl-gym').
        module: The module the library installs, checked before a run starts.
        extra: The ``rayrollout`` extra that installs it ('skyrl-gym').
    """

    source: ClassVar[str] = ""
    module: ClassVar[str] = ""
    extra: ClassVar[str] = ""
    default_hosting = "inline"  # the agent steps the instance itself: it lives in the worker

    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.env_id = ""
        self.rewards: list[float] = []
        self.last: StepResult | None = None
        self.was_reset = False
        self.made = False

    # ------------------------------------------------------------ a source implements

    def make(self) -> None:
        """Make the library's environment (in a worker thread); set ``self.env_id``."""
        raise NotImplementedError

    def start(self, prompt: list[Message]) -> Opening:
        """Reset it (in a worker thread): the conversation the model starts from."""
        raise NotImplementedError

    def advance(self, action: Message) -> StepResult:
        """One step of it (in a worker thread)."""
        raise NotImplementedError

    def shut(self) -> None:
        """Close it (in a worker thread); runs only when ``make`` succeeded."""

    def episode_reward(self, rewards: list[float]) -> float:
        """The episode's reward from its steps' rewards: their sum, unless a source says
        otherwise."""
        return math.fsum(rewards)

    # ------------------------------------------------------------ the session

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """The library is not installed: the line that says how to install it."""
        if cls.module and importlib.util.find_spec(cls.module) is None:
            return (
                f"the '{cls.module}' package ({cls.source}) is not installed; "
                f"pip install 'rayrollout[{cls.extra}]'"
            )
        return None

    def where(self) -> str:
        """The source and the id, as errors name them: "skyrl-gym environment 'text2sql'"."""
        return f"{self.source} environment '{self.env_id or '?'}'"

    async def setup(self) -> None:
        missing = self.unavailable_reason()
        if missing:
            raise ResetStepError(f"{self.where()} cannot be made: {missing}")
        await self._call("could not be made", self.make)
        self.made = True

    async def reset(self, prompt: list[Message]) -> Opening:
        opening = await self._call("failed in reset", self.start, prompt)
        self.was_reset = True
        return opening

    async def step(self, action: Message) -> StepResult:
        if not self.was_reset:
            raise ResetStepError(f"{self.where()} was stepped before it was reset")
        if self.last is not None and self.last.ended:
            raise ResetStepError(f"{self.where()} was stepped after its episode ended")
        result = await self._call(f"failed in step {len(self.rewards) + 1}", self.advance, action)
        self.rewards.append(result.reward)
        self.last = result
        return result

    async def close(self) -> None:
        if self.made:
            self.made = False
            await self._call("failed to close", self.shut)

    async def verify(self, episode: Episode) -> Verification:
        if not self.was_reset:
            raise ResetStepError(
                f"{self.where()} is a reset/step environment and was never reset: play it "
                "with the reset_step agent (--agent reset_step, or the row's 'agent')"
            )
        details: dict[str, Any] = {"source": self.source, "env_id": self.env_id}
        details.update(step_details(self.rewards, self.last))
        return Verification(reward=self.episode_reward(self.rewards), details=details)

    async def _call(self, failing: str, call: Any, *args: Any) -> Any:
        """``call(*args)`` in a worker thread; its failure as a ``ResetStepError`` naming the
        source, the id and what failed."""
        try:
            return await asyncio.to_thread(call, *args)
        except ResetStepError:
            raise
        except ValidationError as exc:  # a StepResult or Opening the library's answer broke
            raise ResetStepError(
                f"{self.where()} {failing}: its answer has an unusable {problem_text(exc)}"
            ) from None
        except Exception as exc:
            raise ResetStepError(
                f"{self.where()} {failing}: {type(exc).__name__}: {str(exc)[:500]}"
            ) from exc


def chat_messages(items: Any, where: str, assistant: bool = False) -> list[Message]:
    """A library's chat messages (dicts with role and content) as ``Message`` objects.

    A role other than system or user (a library's 'tool' text without a call to answer,
    say) is given as a user message: it is what the model reads next. ``assistant`` keeps
    assistant messages (a prompt's few-shot answers) as they are.
    """
    if not isinstance(items, list):
        raise ResetStepError(f"{where} answered messages that are not a list: {items!r:.200}")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise ResetStepError(f"{where} answered a message that is not an object: {item!r:.200}")
        role = item.get("role")
        content = item.get("content")
        text = content if isinstance(content, str) else "" if content is None else str(content)
        kept = {"system", "user", "assistant"} if assistant else {"system", "user"}
        out.append(
            Message.model_validate({"role": role if role in kept else "user", "content": text})
        )
    return out
