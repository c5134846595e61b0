"""NeMo Gym rows opened by the server: the first observation from ``/seed_session``.

aviary and toolsandbox start a live environment per episode in ``/seed_session``, answering
``{env_id, obs, tools}``; ``/step`` takes the model's function calls (or its text, for a
simulated user) and answers ``{obs, reward, done}``; ``/close`` then ``/verify`` give the
reward. ``SeededEpisode`` is that loop as a ``ResetStepSession`` for the ``reset_step`` agent,
the observation put into the conversation exactly as the server wrote it. A seed without
``obs`` ends the episode ``error``; rows whose seed opens a Docker sandbox are refused.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import orjson

from rayrollout.data.nemo_gym_rows import UNSUPPORTED
from rayrollout.data.responses import episode_response, seed_body
from rayrollout.data.schema import Message, Task
from rayrollout.envkit.contract import Verification
from rayrollout.envkit.nemo_gym.gymnasium import PostFn, answer_object
from rayrollout.envkit.reset_step.protocol import (
    Opening,
    ResetStepError,
    StepResult,
    step_details,
)

__all__ = [
    "SANDBOX_FIELDS",
    "SANDBOX_REQUEST",
    "SeededEpisode",
    "opens_sandbox",
    "sandbox_refusal",
    "seed_refusal",
]

SANDBOX_FIELDS = frozenset({"sandbox_descriptor", "sandbox_provider"})
"""Keys of a seed answer that opens a task sandbox (terminal_bench_4's) instead of a chat."""
SANDBOX_REQUEST = ("task_name", "task_ref", "dataset_ref")
"""terminal_bench_4's seed request: the pinned task whose sandbox its seed prepares."""

_ROLES: dict[str, Literal["system", "user", "assistant"]] = {
    "developer": "system",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
}
_NOT_DETAILS = frozenset({"reward", "response", "responses_create_params"})


def sandbox_refusal(where: str) -> str:
    """The refusal of an episode whose seed opens a task sandbox, not a conversation."""
    return (
        f"{UNSUPPORTED}: a task sandbox. {where} opens this row's episode as a Docker task "
        "sandbox (its /seed_session answers sandbox_descriptor and instruction, not a first "
        "observation): NeMo Gym plays it with a sandboxed agent harness "
        "(terminus_2_sandboxed_agent, anyterminal_agent) that runs the model's commands "
        "inside the task's container, which rayrollout does not run"
    )


def opens_sandbox(task: Task) -> bool:
    """Whether the row is terminal_bench_4's seed request (a pinned task's sandbox): it is
    refused before seeding, which would provision a container nobody drives."""
    return all(key in task.fields for key in SANDBOX_REQUEST)


def seed_refusal(where: str, answer: dict[str, Any]) -> str:
    """Why a seed answer without ``obs`` cannot be played: the missing piece named."""
    if SANDBOX_FIELDS & answer.keys() or "instruction" in answer:
        return sandbox_refusal(where)
    return (
        f"{UNSUPPORTED}: a first observation in another form. {where} answered /seed_session "
        f"without 'obs' (the first observation as input messages; got keys "
        f"{sorted(answer)[:12]}), so the episode has nothing to start from"
    )


class SeededEpisode:
    """One episode on a server that opened it in ``/seed_session`` (see the module)."""

    def __init__(self, post: PostFn, where: str, task: Task, answer: dict[str, Any]) -> None:
        """
        Args:
            post: The episode's POST (its cookie jar keeps the server's session).
            where: How errors name the server: "NeMo Gym server 'toolsandbox' at http://...".
            task: The episode's task (its row is the seed request and goes to /verify).
            answer: The server's ``/seed_session`` answer, with ``obs`` in it.
        """
        self.post = post
        self.where = where
        self.task = task
        self.answer = answer
        self.env_id = answer.get("env_id")
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ResetStepError(
                f"{where} answered /seed_session with 'obs' but no 'env_id' (the id its /step, "
                f"/close and /verify name the episode by): got {self.env_id!r:.100}"
            )
        self.observation = _messages(answer.get("obs"), where, "/seed_session")
        if not self.observation:
            raise ResetStepError(f"{where} answered /seed_session with an empty 'obs'")
        self.tools = _chat_tools(answer.get("tools"), where)
        agent = task.fields.get("agent_ref")
        name = agent.get("name") if isinstance(agent, dict) else None
        # aviary_agent ends an episode on a reply without function calls; toolsandbox_agent
        # sends that reply to the server.
        self.steps_text = not (isinstance(name, str) and "aviary" in name)
        self.opening: list[Message] = []
        self.rewards: list[float] = []
        self.last: StepResult | None = None
        self.was_reset = False
        self.closed = False

    async def reset(self, prompt: list[Message]) -> Opening:
        """The conversation the model starts from: the prompt (the row's ``instructions``, if
        any), then the server's observation, as NeMo Gym's harnesses build their input."""
        self.opening = [*prompt, *self.observation]
        self.was_reset = True
        info = {"env_id": self.env_id}
        if isinstance(self.answer.get("scenario"), str):
            info["scenario"] = self.answer["scenario"]
        return Opening(messages=self.opening, tools=self.tools, info=info)

    async def step(self, action: Message) -> StepResult:
        if not self.was_reset:
            raise ResetStepError(f"{self.where} was stepped before the episode was opened")
        if self.last is not None and self.last.ended:
            raise ResetStepError(f"{self.where} was stepped after its episode ended")
        calls = [
            {
                "type": "function_call",
                "id": f"fc_{call.id}",
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
                "status": "completed",
            }
            for call in action.tool_calls or []
        ]
        if not calls and not self.steps_text:
            result = StepResult(reward=0.0, terminated=True, info={"ended_by": "no tool call"})
            self.last = result
            return result
        body = {
            "env_id": self.env_id,
            "action": calls,
            "function_calls": calls,
            "text": None if calls else (action.content or ""),
        }
        status, text = await self.post("step", body, False)  # a step must not run twice
        answer = answer_object(status, text, self.where, "step")
        reward = answer.get("reward", 0.0)
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise ResetStepError(
                f"{self.where} answered step {len(self.rewards) + 1} with a 'reward' that is "
                f"not a number: {reward!r:.100}"
            )
        if not math.isfinite(reward):
            raise ResetStepError(
                f"{self.where} answered step {len(self.rewards) + 1} with reward {reward!r}, "
                "which is not a finite number"
            )
        result = StepResult(
            observation=_messages(answer.get("obs"), self.where, "/step"),
            reward=float(reward),
            terminated=bool(answer.get("done")),
        )
        self.rewards.append(result.reward)
        self.last = result
        return result

    async def release(self) -> None:
        """``POST /close`` with the ``env_id``, once: the server drops (and toolsandbox
        scores) the environment; NeMo Gym's harnesses close before they verify."""
        if self.closed:
            return
        self.closed = True
        status, text = await self.post("close", {"env_id": self.env_id}, True)
        if status >= 400 and status not in (404, 405):
            raise ResetStepError(
                f"{self.where} answered HTTP {status} to POST /close: {text[:300]}"
            )

    async def verify(self, messages: list[Message], model: str = "") -> Verification:
        """Close the environment, then ``/verify`` the episode: the server's reward, with the
        steps' record and what the answer adds beside it."""
        if not self.was_reset:
            raise ResetStepError(
                f"{self.where} opened the episode in /seed_session (env_id {self.env_id}) and it "
                "was never played: its actions go through /step, so play it with the "
                "reset_step agent (--agent reset_step, or the row's 'agent')"
            )
        await self.release()
        seeded = self.task.model_copy(update={"prompt": self.opening, "tools": self.tools})
        response = episode_response(seeded, messages, model)
        group = self.task.fields.get("task_idx", self.task.task_id)
        response.update(env_id=self.env_id, group_id=str(group), contains_transitions=False)
        body = {**seed_body(self.task), "response": response}
        answer = answer_object(*await self.post("verify", body, True), self.where, "verify")
        try:
            reward = float(answer["reward"])
        except (KeyError, TypeError, ValueError):
            raise ResetStepError(
                f"{self.where} answered /verify without a numeric 'reward': {str(answer)[:300]}"
            ) from None
        if not math.isfinite(reward):
            raise ResetStepError(
                f"{self.where} gave reward {answer['reward']!r}, which is not a finite number"
            )
        details: dict[str, Any] = {"source": "NeMo Gym seed_session", "env_id": self.env_id}
        details.update(step_details(self.rewards, self.last))
        details.update(
            (k, v)
            for k, v in answer.items()
            if k not in _NOT_DETAILS and (k not in body or body[k] != v)
        )
        return Verification(reward=reward, details=details)


def _messages(items: Any, where: str, route: str) -> list[Message]:
    """``obs`` items as chat messages, each text kept exactly as the server wrote it."""
    if not isinstance(items, list):
        raise ResetStepError(
            f"{where} answered {route} with 'obs' that is not a list: {items!r:.200}"
        )
    messages = []
    for i, item in enumerate(items):
        kind = (item.get("type") or "message") if isinstance(item, dict) else None
        if kind == "function_call_output" and isinstance(item.get("call_id"), str):
            output = item.get("output")
            content = output if isinstance(output, str) else orjson.dumps(output).decode()
            messages.append(Message(role="tool", tool_call_id=item["call_id"], content=content))
        elif kind == "message" and item.get("role") in _ROLES:
            content = item.get("content")
            if isinstance(content, list):  # text parts; a media part has no text to keep
                content = "".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
            if not isinstance(content, str):
                raise ResetStepError(
                    f"{where} answered {route} with obs[{i}] whose content is not text: "
                    f"{content!r:.200}"
                )
            messages.append(Message(role=_ROLES[item["role"]], content=content))
        else:
            raise ResetStepError(
                f"{where} answered {route} with obs[{i}] that is neither a message nor a "
                f"function_call_output: {item!r:.200}"
            )
    return messages


def _chat_tools(tools: Any, where: str) -> list[dict[str, Any]]:
    """The seed answer's Responses-API function tools in Chat Completions form."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ResetStepError(f"{where} answered /seed_session with 'tools' that is not a list")
    chat = []
    for i, tool in enumerate(tools):
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ResetStepError(
                f"{where} answered /seed_session with tools[{i}] that names no function: "
                f"{tool!r:.200}"
            )
        spec = {
            "name": function["name"],
            "description": function.get("description") or "",
            "parameters": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if "strict" in function:
            spec["strict"] = function["strict"]
        chat.append({"type": "function", "function": spec})
    return chat
