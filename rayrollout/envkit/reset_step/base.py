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
import difflib
import importlib.util
import math
from collections.abc import Collection
from typing import Any, ClassVar

from pydantic import ValidationError

from rayrollout.data.schema import Message, Task
from rayrollout.data.validation import problem_text
from rayrollout.envkit.contract import Environment, Episode, Verification
from rayrollout.envkit.reset_step.protocol import (
    Opening,
    ResetStepError,
    StepResult,
    step_details,
)

__all__ = ["ResetStepEnvironment", "chat_messages"]


class ResetStepEnvironment(Environment):
    """An environment played by reset and step (the ``reset_step`` agent), in this process.

    It is played by the ``reset_step`` agent unless the row or the run names another
    (``default_agent``), within the library environment's own turn limit (``turn_limit``).
    Before a run, each row's id is looked up in the library's registry (``task_problem``),
    an unknown one named with the nearest registered ids.

    Class attributes:
        source: The library's name, as errors and ``details`` name it ('skyrl-gym').
        module: The module the library installs, checked before a run starts.
        extra: The ``rayrollout`` extra that installs it ('skyrl-gym').
        id_field: The row field naming the library's environment id ('env_class'); rows
            without it take the ``env_id`` argument.
    """

    source: ClassVar[str] = ""
    module: ClassVar[str] = ""
    extra: ClassVar[str] = ""
    id_field: ClassVar[str] = "env_id"
    default_hosting = "inline"  # the agent steps the instance itself: it lives in the worker
    default_agent = "reset_step"  # naming the environment is enough to play it

    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.env_id = ""
        self.rewards: list[float] = []
        self.last: StepResult | None = None
        self.was_reset = False
        self.made = False

    # ------------------------------------------------------------ a source implements

    @classmethod
    def known_ids(cls) -> Collection[str] | None:
        """The ids the library registers (importing it: only asked once it is installed);
        None where the source makes its environment without one (nothing to look up)."""
        return None

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

    def own_limit(self) -> Any:
        """The library environment's own turn limit, read once it is made: its
        ``max_turns`` attribute (GEM's games and skyrl-gym's environments both keep one),
        None where it has none."""
        return getattr(getattr(self, "env", None), "max_turns", None)

    def episode_reward(self, rewards: list[float]) -> float:
        """The episode's reward from its steps' rewards: their sum, unless a source says
        otherwise."""
        return math.fsum(rewards)

    # ------------------------------------------------------------ the checks before a run

    @classmethod
    def id_of(cls, task: Task, args: dict[str, Any]) -> str:
        """The id an episode of ``task`` makes: the row's ``id_field``, else the ``env_id``
        argument ('' when neither gives one)."""
        row_id = task.fields.get(cls.id_field)
        if row_id is not None:
            return str(row_id)
        return str(args.get("env_id") or "")

    @classmethod
    def id_problem(cls, env_id: str) -> str | None:
        """Why ``env_id`` cannot be made (none given, or not registered, with the nearest
        registered ids), or None when the library registers it (or has no registry)."""
        known = cls.known_ids()
        if known is None:
            return None
        if not env_id:
            return (
                f"{cls.source} environment: no id; give the rows the field '{cls.id_field}' "
                "or set environments.NAME.args.env_id in the config"
            )
        if env_id in known:
            return None
        return f"{cls.source} environment id '{env_id}' is not registered; {_near(env_id, known)}"

    @classmethod
    def config_problem(cls, args: dict[str, Any]) -> str | None:
        """The ``env_id`` argument, when given, is a registered id (nothing is said while
        the library is missing: ``unavailable_reason`` says that)."""
        env_id = args.get("env_id")
        if not env_id or cls.unavailable_reason() is not None:
            return None
        return cls.id_problem(str(env_id))

    @classmethod
    def task_problem(cls, task: Task, args: dict[str, Any]) -> str | None:
        """The row's id (``id_of``) is registered."""
        if cls.unavailable_reason() is not None:
            return None
        return cls.id_problem(cls.id_of(task, args))

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

    def turn_limit(self) -> int | None:
        """The library's own turn limit for this episode (``own_limit``), so an episode is
        never cut by the run's default ``max_turns`` before the game would end it."""
        own = self.own_limit()
        if isinstance(own, bool) or not isinstance(own, int) or own < 1:
            return None
        return own

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
                f"{self.where()} is a reset/step environment and was never reset: another "
                "agent played it; play it with the reset_step agent, its default (leave the "
                "row's 'agent' and --agent unset, or name reset_step)"
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


def _near(wrong: str, known: Collection[str]) -> str:
    """What to pass instead of ``wrong``: the nearest of ``known`` (difflib), else all of
    them when they are few, else how many there are."""
    names = sorted(known)
    close = difflib.get_close_matches(wrong, names, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(f"'{name}'" for name in close) + "?"
    if len(names) <= 12:
        return "registered: " + ", ".join(names)
    lower = wrong.lower()
    same_prefix = [n for n in names if n.lower().split(":")[0] == lower.split(":")[0]]
    if same_prefix and ":" in wrong:
        shown = ", ".join(same_prefix[:8]) + (", ..." if len(same_prefix) > 8 else "")
        return f"{len(names)} ids are registered, of them with this prefix: {shown}"
    return f"{len(names)} ids are registered, none near it"


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
