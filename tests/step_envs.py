"""A tiny reset/step environment for the reset_step agent's tests (imported by module path
in worker actors, like ``fixture_envs``): no library needed, every ending reachable."""

from __future__ import annotations

import re

from rayrollout.data.schema import Message
from rayrollout.envkit.reset_step import Opening, ResetStepEnvironment, StepResult


class TallyEnv(ResetStepEnvironment):
    """Each reply's number is its step's reward (none: 0); a reply with 'stop' ends the
    episode (terminated), the task's ``limit`` steps cut it short (truncated), 'boom' breaks
    the environment, 'nan' answers a reward that is not a number."""

    source = "tally"

    def make(self) -> None:
        self.env_id = "tally"
        self.limit = int(self.task.fields.get("limit", 100))

    def start(self, prompt: list[Message]) -> Opening:
        return Opening(messages=[*prompt, Message(role="user", content="Say a number.")])

    def advance(self, action: Message) -> StepResult:
        text = action.content or ""
        if "boom" in text:
            raise ValueError("the tally broke")
        if "nan" in text:
            return StepResult(reward=float("nan"))  # what a library's NaN reward would build
        found = re.search(r"-?\d+(?:\.\d+)?", text)
        reward = float(found.group()) if found else 0.0
        step = len(self.rewards) + 1
        return StepResult(
            observation=[Message(role="user", content=f"Step {step} scored {reward}.")],
            reward=reward,
            terminated="stop" in text,
            truncated=step >= self.limit,
            info={"step": step},
        )
