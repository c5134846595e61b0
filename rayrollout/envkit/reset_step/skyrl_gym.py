"""skyrl-gym environments (SkyRL's ``skyrl_gym``) by id, in this process.

What SkyRL's own generator does, per episode: ``skyrl_gym.make(id, env_config=...,
extras=row)``, ``init(prompt)`` for the conversation the model starts from, then
``step(text)`` with each reply until ``done``, each answering ``{observations, reward, done,
metadata}``; ``close`` at the end. Tools are parsed from the reply's text by the environment
(``<sql>``, ``<solution>``), so the model is offered no tools.

The id is the row's ``env_class`` (the column SkyRL's datasets carry), else the
``env_id`` argument (``environments.NAME.args.env_id``); before a run every row's id is
looked up in skyrl-gym's registry, an unknown one named with the nearest registered ids.
``extras`` are the row's other fields as the task holds them (``reward_spec``,
``extra_info``, ``db_id``, ...), and ``env_config`` comes from the ``env_config`` argument
(SkyRL's ``environment.skyrl_gym.<id>`` settings, e.g. ``{db_path: ...}`` for text2sql), as
the ``DictConfig`` skyrl-gym reads. An episode plays to the environment's own turn limit (its
``max_turns``) unless the config sets ``episode.max_turns``.

skyrl-gym's ``done`` is one flag for both endings: an episode it ends is ``terminated``. A
step's ``postprocessed_action`` (where a source trims the reply) is kept in the step's info;
the transcript keeps what the model wrote.

Install: ``pip install 'rayrollout[skyrl-gym]'``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from rayrollout.data.schema import Message, Task
from rayrollout.envkit.reset_step.base import ResetStepEnvironment, chat_messages
from rayrollout.envkit.reset_step.protocol import Opening, ResetStepError, StepResult

__all__ = ["SkyrlGymEnvironment"]


class SkyrlGymEnvironment(ResetStepEnvironment):
    """A skyrl-gym environment by id (the row's ``env_class``, else ``env_id``)."""

    name = "skyrl_gym"
    source = "skyrl-gym"
    module = "skyrl_gym"
    extra = "skyrl-gym"
    id_field = "env_class"

    def __init__(
        self, task: Task, *, env_id: str | None = None, env_config: dict[str, Any] | None = None
    ) -> None:
        """
        Args:
            task: The episode's task; its fields are the environment's ``extras``.
            env_id: The skyrl-gym id for rows without an ``env_class`` ('gsm8k_multi_turn').
            env_config: The environment's config (SkyRL's ``environment.skyrl_gym.<id>``).
        """
        super().__init__(task)
        self.env_id = self.id_of(task, {"env_id": env_id})
        self.env_config = dict(env_config or {})
        self.env: Any = None

    @classmethod
    def known_ids(cls) -> Collection[str] | None:
        import skyrl_gym

        return skyrl_gym.registry.keys()

    def make(self) -> None:
        import skyrl_gym
        from omegaconf import OmegaConf  # skyrl-gym's own dependency: its configs are these

        problem = self.id_problem(self.env_id)
        if problem is not None:
            raise ResetStepError(problem)
        extras = {k: v for k, v in self.task.fields.items() if k != "env_class"}
        self.env = skyrl_gym.make(
            self.env_id, env_config=OmegaConf.create(self.env_config), extras=extras
        )

    def start(self, prompt: list[Message]) -> Opening:
        messages, info = self.env.init([m.to_openai() for m in prompt])
        opening = chat_messages(messages, self.where(), assistant=True)
        return Opening(messages=opening, info=dict(info or {}))

    def advance(self, action: Message) -> StepResult:
        answer = self.env.step(action.content or "")
        info = dict(answer.get("metadata") or {})
        if answer.get("postprocessed_action") is not None:
            info["postprocessed_action"] = answer["postprocessed_action"]
        return StepResult(
            observation=chat_messages(answer.get("observations") or [], self.where()),
            reward=answer["reward"],
            terminated=bool(answer["done"]),
            info=info,
        )

    def shut(self) -> None:
        self.env.close()
