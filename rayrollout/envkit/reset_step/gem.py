"""GEM environments (``gem-llm``'s ``gem``) by id, in this process.

What GEM's own loops do, per episode: ``gem.make(id, **kwargs)``, ``reset(seed)`` for the
first observation, then ``step(text)`` with each reply, answering ``(observation, reward,
terminated, truncated, info)``, until either flag is set. Actions are parsed from the reply's
text (``\\boxed{7}``), so the model is offered no tools. The first observation follows the
task's prompt as a user message (a row's prompt is the system prompt of the game, say), and
each observation after a step is the next user message.

The id is the row's ``env_id``, else the ``env_id`` argument; the seed the row's ``seed``,
else the ``seed`` argument (every sample of a row, a GRPO group, then plays the same game;
without one each sample draws its own). ``env_kwargs`` go to ``gem.make``. Before a run, every
row's id is looked up in GEM's registry and its seed checked, so a mistyped id stops the run
with the nearest registered ids. An episode plays to the game's own turn limit (its
``max_turns``, read once it is reset) unless the config sets ``episode.max_turns``.

GEM seeds Python's and NumPy's global random generators in ``reset`` and draws from them
(``gem.utils.seeding``), so ``make`` and ``reset`` hold one lock per process: two episodes
resetting at once on a worker's threads would otherwise swap their games.

Install: ``pip install 'rayrollout[gem]'`` (gem-llm 0.1.0 pins reasoning-gym 0.1.23, so it
installs beside rayrollout but not beside its ``dev`` or ``reasoning-gym`` extras, which need
0.1.25 or later: give GEM its own virtual environment when you need both).
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any

from rayrollout.data.schema import Message, Task
from rayrollout.envkit.reset_step.base import ResetStepEnvironment
from rayrollout.envkit.reset_step.protocol import Opening, ResetStepError, StepResult

__all__ = ["GemEnvironment"]

_GLOBAL_RANDOM = threading.Lock()
"""Held around GEM's ``make`` and ``reset``: both use the process's global random state."""


class GemEnvironment(ResetStepEnvironment):
    """A GEM environment by id (the row's ``env_id``, else the argument), seeded by ``seed``."""

    name = "gem"
    source = "GEM"
    module = "gem"
    extra = "gem"

    def __init__(
        self,
        task: Task,
        *,
        env_id: str | None = None,
        seed: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """
        Args:
            task: The episode's task; its ``env_id`` and ``seed`` fields win over the args.
            env_id: The GEM id for rows without one ('game:GuessTheNumber-v0-easy').
            seed: The reset seed for rows without one (None: a random game per episode).
            env_kwargs: Keyword arguments of ``gem.make`` (a game's size, its turn limit).
        """
        super().__init__(task)
        self.env_id = self.id_of(task, {"env_id": env_id})
        self.seed: Any = task.fields.get("seed", seed)
        self.env_kwargs = dict(env_kwargs or {})
        self.env: Any = None

    @classmethod
    def known_ids(cls) -> Collection[str] | None:
        # Importing gem registers its ids (gem/envs/__init__.py), the registry's parent too.
        from gem.envs.registration import ENV_REGISTRY

        return ENV_REGISTRY.keys()

    @classmethod
    def task_problem(cls, task: Task, args: dict[str, Any]) -> str | None:
        """The row's id is registered and its seed is one GEM takes."""
        problem = super().task_problem(task, args)
        if problem is None:
            problem = _seed_problem(task.fields.get("seed", args.get("seed")))
        return problem

    def make(self) -> None:
        import gem

        problem = self.id_problem(self.env_id) or _seed_problem(self.seed)
        if problem is not None:
            raise ResetStepError(problem)
        with _GLOBAL_RANDOM:
            self.env = gem.make(self.env_id, **self.env_kwargs)

    def start(self, prompt: list[Message]) -> Opening:
        with _GLOBAL_RANDOM:
            observation, info = self.env.reset(seed=self.seed)
        first = Message(role="user", content=_text(observation))
        return Opening(messages=[*prompt, first], info=dict(info or {}))

    def advance(self, action: Message) -> StepResult:
        observation, reward, terminated, truncated, info = self.env.step(action.content or "")
        return StepResult(
            observation=[Message(role="user", content=_text(observation))],
            reward=reward,
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=dict(info or {}),
        )

    def shut(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):  # GEM's Env declares none; some of its environments add one
            close()


def _seed_problem(seed: Any) -> str | None:
    """Why ``seed`` is not a seed GEM takes (a whole number >= 0, or none), or None."""
    if seed is None or (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
        return None
    return f"GEM environment: the seed must be a whole number >= 0 (GEM's own rule), got {seed!r}"


def _text(observation: Any) -> str:
    return observation if isinstance(observation, str) else str(observation)
