"""``OpenEnvEpisode``: one episode on an OpenEnv channel, as a ``ResetStepSession``.

What OpenEnv's own clients do, per episode: reset (the row's ``seed`` and ``reset_kwargs``
as its arguments), then step until an observation says ``done``. For an MCP environment the
reset is followed by one ``list_tools`` step, whose tools the model is offered; each tool
call of a reply is then one ``call_tool`` step, answered as a tool message. For a typed
environment the reply's JSON is the action, and the model is told the schema once, after
the first observation.

Rewards: each step's reward as the environment gives it (``None`` is 0), any finite float;
a reply's step reward is the sum of its calls' rewards (each call's in the step's ``info``);
the episode's reward is the sum of its step rewards. Reset's and ``list_tools``' rewards are
not step rewards (no reply caused them); a non-zero one is kept in the reset ``info``.

A reply the environment cannot take (no JSON object, arguments that do not validate, a tool
call with JSON arguments that do not parse) steps nothing: the model reads why, and the
step scores 0. A reply without tool calls in an MCP environment ends the episode (the model
has stopped acting), as tool-calling loops end.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from rayrollout.data.schema import Message
from rayrollout.envkit.contract import Verification
from rayrollout.envkit.openenv.actions import (
    chat_tools,
    is_tool_schema,
    json_action,
    observation_text,
    rejected,
    schema_note,
    tool_output,
)
from rayrollout.envkit.openenv.channel import ActionRejected, OpenEnvChannel, OpenEnvError
from rayrollout.envkit.reset_step.protocol import Opening, StepResult, step_details

__all__ = ["OpenEnvEpisode"]


class OpenEnvEpisode:
    """Reset, steps and close of one OpenEnv environment instance."""

    def __init__(
        self, channel: OpenEnvChannel, reset_data: dict[str, Any], describe_action: bool = True
    ) -> None:
        """
        Args:
            channel: The instance's channel (a WebSocket session, or the class in process).
            reset_data: The arguments of its reset (seed, and what else the class takes).
            describe_action: Tell the model a typed action's JSON schema after the first
                observation (off when the task's prompt already does).
        """
        self.channel = channel
        self.where = channel.where
        self.reset_data = reset_data
        self.describe_action = describe_action
        self.schema: dict[str, Any] = {}
        self.uses_tools = False
        self.opened = False
        self.was_reset = False
        self.rewards: list[float] = []
        self.last: StepResult | None = None

    async def open(self) -> None:
        self.opened = True  # close runs from here on, whatever open does
        self.schema = await self.channel.open()
        self.uses_tools = is_tool_schema(self.schema)

    async def reset(self, prompt: list[Message]) -> Opening:
        if not self.opened:
            raise OpenEnvError(f"{self.where} was reset before it was opened")
        payload = await self.channel.reset(self.reset_data)
        if payload.done:
            raise OpenEnvError(f"{self.where} says its episode is done at reset")
        info: dict[str, Any] = {"metadata": payload.metadata or {}}
        if payload.reward:
            info["reset_reward"] = payload.reward
        lines = [observation_text(payload.observation)]
        tools: list[dict[str, Any]] = []
        if self.uses_tools:
            try:
                listing = await self.channel.step({"type": "list_tools"})
            except ActionRejected as exc:
                raise OpenEnvError(f"{self.where} refused list_tools: {exc}") from None
            tools = chat_tools(listing.observation, self.where)
            if listing.reward:
                info["list_tools_reward"] = listing.reward
        elif self.describe_action:
            lines.append(schema_note(self.schema))
        self.was_reset = True
        text = "\n\n".join(line for line in lines if line)
        first = [Message(role="user", content=text)] if text else []
        return Opening(messages=[*prompt, *first], tools=tools, info=info)

    async def step(self, action: Message) -> StepResult:
        if not self.was_reset:
            raise OpenEnvError(f"{self.where} was stepped before it was reset")
        if self.last is not None and self.last.ended:
            raise OpenEnvError(f"{self.where} was stepped after its episode ended")
        result = await (self._tool_step(action) if self.uses_tools else self._typed_step(action))
        self.rewards.append(result.reward)
        self.last = result
        return result

    async def _typed_step(self, action: Message) -> StepResult:
        try:
            payload = await self.channel.step(json_action(action.content))
        except ActionRejected as exc:
            return StepResult(observation=[rejected(str(exc))], reward=0.0, info=_refused(exc))
        text = observation_text(payload.observation)
        return StepResult(
            observation=[Message(role="user", content=text)] if text else [],
            reward=payload.reward or 0.0,
            terminated=payload.done,
            info=payload.metadata or {},
        )

    async def _tool_step(self, action: Message) -> StepResult:
        calls = action.tool_calls or []
        if not calls:
            return StepResult(reward=0.0, terminated=True, info={"ended": "no tool call"})
        answers: list[Message] = []
        rewards: list[float] = []
        done = False
        for call in calls:
            name = call.function.name
            if done:  # an earlier call ended the episode: this one never ran
                answers.append(_answer(call.id, name, "Not run: the episode had ended."))
                continue
            try:
                arguments = orjson.loads(call.function.arguments or "{}")
                if not isinstance(arguments, dict):
                    raise ActionRejected("the arguments are not a JSON object")
                step = {"type": "call_tool", "tool_name": name, "arguments": arguments}
                payload = await self.channel.step(step)
            except (ActionRejected, orjson.JSONDecodeError) as exc:
                answers.append(_answer(call.id, name, f"Error: not called: {exc}"))
                rewards.append(0.0)
                continue
            answers.append(_answer(call.id, name, tool_output(payload.observation)))
            rewards.append(payload.reward or 0.0)
            done = payload.done
        return StepResult(
            observation=answers,
            reward=math.fsum(rewards),
            terminated=done,
            info={"call_rewards": rewards},
        )

    def verification(self) -> Verification:
        """The episode's verdict: the sum of its step rewards, and how it ended."""
        if not self.was_reset:
            raise OpenEnvError(
                f"{self.where} is a reset/step environment and was never reset: play it "
                "with the reset_step agent (--agent reset_step, or the row's 'agent')"
            )
        details: dict[str, Any] = {"source": "OpenEnv", "env": self.where}
        details.update(step_details(self.rewards, self.last))
        return Verification(reward=math.fsum(self.rewards), details=details)

    async def close(self) -> None:
        if self.opened:
            self.opened = False
            await self.channel.close()


def _answer(call_id: str, name: str, text: str) -> Message:
    return Message(role="tool", tool_call_id=call_id, name=name, content=text)


def _refused(exc: ActionRejected) -> dict[str, Any]:
    return {"action_refused": str(exc)}
