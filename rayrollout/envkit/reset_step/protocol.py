"""The reset/step session: what the ``reset_step`` agent needs of any source.

One session, one episode: ``reset`` answers the conversation the model starts from; each
``step`` takes the whole assistant ``Message`` as the action (text, tool calls or JSON, as
the source reads it) and answers the observation, the step's reward and whether it ended.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rayrollout.data.schema import Message
from rayrollout.envkit.errors import ResetStepError

__all__ = [
    "Opening",
    "ResetStepError",
    "ResetStepSession",
    "StepResult",
    "reset_step_session",
    "step_details",
]


class Opening(BaseModel):
    """What ``reset`` answers: the conversation the model starts from."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(
        min_length=1,
        description="The task's prompt as the environment hands it back, with its first "
        "observation (a user message) where it gives one.",
    )
    tools: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Tools the model is offered (OpenAI chat function schemas): an MCP "
        "environment's; none for sources that read the reply's text.",
    )
    info: dict[str, Any] = Field(default_factory=dict, description="The source's reset info.")


class StepResult(BaseModel):
    """What one ``step`` answers."""

    model_config = ConfigDict(extra="forbid")

    observation: list[Message] = Field(
        default_factory=list,
        description="What the model reads next (user messages; tool messages for tool "
        "outputs); nothing when the source gives none.",
    )
    reward: float = Field(allow_inf_nan=False, description="This step's reward, any finite float.")
    terminated: bool = Field(default=False, description="The episode reached its end state.")
    truncated: bool = Field(
        default=False, description="The source cut the episode short (its own turn limit)."
    )
    info: dict[str, Any] = Field(default_factory=dict, description="The source's step info.")

    @property
    def ended(self) -> bool:
        return self.terminated or self.truncated


@runtime_checkable
class ResetStepSession(Protocol):
    """One episode's reset/step connection to its environment."""

    async def reset(self, prompt: list[Message]) -> Opening: ...
    async def step(self, action: Message) -> StepResult: ...


def reset_step_session(session: object) -> ResetStepSession | None:
    """The reset/step side of an episode's environment session, or None where it has none.

    A session kind that speaks reset/step itself is its own; an inline session hands over
    its environment instance when that is a reset/step environment. A Serve-hosted
    environment has none (its instance lives on a replica the agent cannot step).
    """
    if isinstance(session, ResetStepSession):
        return session
    environment = getattr(session, "env", None)
    if isinstance(environment, ResetStepSession):
        return environment
    return None


def step_details(rewards: list[float], last: StepResult | None) -> dict[str, Any]:
    """How a reset/step episode went, for its verification's ``details``: every source
    (in process or by URL) records the same keys, so trainers and ``show`` read one shape."""
    details: dict[str, Any] = {
        "steps": len(rewards),
        "step_rewards": list(rewards),
        "terminated": bool(last and last.terminated),
        "truncated": bool(last and last.truncated),
    }
    if last is not None and last.ended and last.observation:
        # The model never reads what the environment says at the end; it is kept here.
        details["final_observation"] = [m.content for m in last.observation]
    if last is not None and last.info:
        details["info"] = last.info
    return details
