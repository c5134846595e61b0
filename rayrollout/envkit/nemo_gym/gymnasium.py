"""NeMo Gym's Gymnasium-style resources servers by URL: an episode played by reset and step.

Some of NeMo Gym's resources servers (its ``GymnasiumServer`` base: blackjack, wordle,
sokoban, ...) have no ``/seed_session`` or ``/verify`` that scores. They speak Gymnasium's
loop over HTTP instead, sessions kept by the server's cookie:

* ``POST /reset`` with the task row answers ``{observation, info}``;
* ``POST /step`` with the task row plus ``response`` (this turn's Responses-API answer of
  the model) answers ``{observation, reward, terminated, truncated, info}``; a step that
  ends the episode releases the server's state; ``info.tool_outputs`` answers the model's
  function calls (``{call_id, output}``);
* ``POST /close`` (optional; offered where reset's ``info.supports_explicit_close``)
  releases an episode that did not end.

``GymnasiumEpisode`` is that loop as a ``ResetStepSession``, so the ``reset_step`` agent
plays it like any reset/step source. It rides on the episode's ``RemoteSession`` (its
cookie jar, connection pool, token and retries), which hands it over when the server
answers ``/seed_session`` with 404: the server is chosen by URL as any NeMo Gym server, and
its kind found by asking. Observations become user messages and tool outputs tool
messages, in the order NeMo Gym's own ``gymnasium_agent`` appends them; the episode's reward
is the sum of its step rewards, as that agent sums them.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from pydantic import ValidationError

from rayrollout.data.json_text import json_object
from rayrollout.data.responses import episode_response, seed_body
from rayrollout.data.schema import Message, Task
from rayrollout.data.validation import problem_text
from rayrollout.envkit.contract import Verification
from rayrollout.envkit.reset_step.protocol import (
    Opening,
    ResetStepError,
    StepResult,
    step_details,
)

__all__ = ["GymnasiumEpisode", "PostFn", "answer_object"]

PostFn = Callable[[str, Any, bool], Awaitable[tuple[int, str]]]
"""``post(route, body, retry)``: the session's POST, answering ``(status, text)``."""


class GymnasiumEpisode:
    """One episode on a Gymnasium-style NeMo Gym server: reset, steps, close where offered."""

    def __init__(self, post: PostFn, where: str, task: Task, setting: str = "") -> None:
        """
        Args:
            post: The episode's POST (its cookie jar keeps the server's session).
            where: How errors name the server: "NeMo Gym server 'blackjack' at http://...".
            task: The episode's task; its row is the body of every reset and step.
            setting: The config field that names the server, for errors that say what to
                check ('environments.blackjack.url').
        """
        self.post = post
        self.where = where
        self.setting = setting
        self.task = task
        self.row = seed_body(task)
        self.reset_info: dict[str, Any] = {}
        self.rewards: list[float] = []
        self.last: StepResult | None = None
        self.was_reset = False

    @property
    def offers_close(self) -> bool:
        return self.reset_info.get("supports_explicit_close") is True

    async def _call(
        self, route: str, body: Any, retry: bool = True, known: tuple[int, str] | None = None
    ) -> dict[str, Any]:
        """POST (or the answer ``known`` already) as a JSON object; a failure names the route."""
        return answer_object(*(known or await self.post(route, body, retry)), self.where, route)

    async def reset(self, prompt: list[Message]) -> Opening:
        status, text = await self.post("reset", self.row, True)
        if status == 404:
            check = f"; check {self.setting}" if self.setting else ""
            raise ResetStepError(
                f"{self.where} has no POST /seed_session and no POST /reset (404): it is "
                "neither a NeMo Gym resources server nor a Gymnasium-style one" + check
            )
        answer = await self._call("reset", self.row, known=(status, text))
        info = answer.get("info")
        self.reset_info = dict(info) if isinstance(info, dict) else {}
        self.was_reset = True
        observation = answer.get("observation")
        first = [Message(role="user", content=str(observation))] if observation else []
        return Opening(messages=[*prompt, *first], info=self.reset_info)

    async def step(self, action: Message) -> StepResult:
        if not self.was_reset:
            raise ResetStepError(f"{self.where} was stepped before it was reset")
        if self.last is not None and self.last.ended:
            raise ResetStepError(f"{self.where} was stepped after its episode ended")
        body: dict[str, Any] = {
            **self.row,
            "response": episode_response(self.task, [*self.task.prompt, action]),
        }
        # A server that says its steps are idempotent gets an id per step, so a retried step
        # is applied once; any other step is sent once (a retry could apply it twice).
        idempotent = self.reset_info.get("supports_step_idempotency") is True
        if idempotent:
            body["_ng_step_request_id"] = uuid.uuid4().hex
        answer = await self._call("step", body, retry=idempotent)
        try:
            result = StepResult(
                observation=_observation(answer),
                reward=answer.get("reward", 0.0),
                terminated=bool(answer.get("terminated")),
                truncated=bool(answer.get("truncated")),
                info=answer.get("info") or {},
            )
        except ValidationError as exc:
            raise ResetStepError(
                f"{self.where} answered step {len(self.rewards) + 1} with an unusable "
                f"{problem_text(exc)}"
            ) from None
        self.rewards.append(result.reward)
        self.last = result
        return result

    def verification(self) -> Verification:
        """The episode's verdict: the sum of its step rewards, and how it ended."""
        if not self.was_reset:
            raise ResetStepError(
                f"{self.where} is a Gymnasium-style server (/reset and /step, no "
                "/seed_session) and the episode never reset it: play it with the reset_step "
                "agent (--agent reset_step, or the row's 'agent')"
            )
        details: dict[str, Any] = {"source": "NeMo Gym gymnasium"}
        details.update(step_details(self.rewards, self.last))
        return Verification(reward=math.fsum(self.rewards), details=details)

    async def close(self) -> None:
        """Release the server's state: ``/close`` where reset offered it, or where the
        episode did not end (a server without it answers 404: nothing to release, as its
        terminal step would have released it)."""
        ended = self.last is not None and self.last.ended
        if not self.was_reset or (ended and not self.offers_close):
            return
        status, text = await self.post("close", {}, True)
        if status >= 400 and status not in (404, 405):
            raise ResetStepError(
                f"{self.where} answered HTTP {status} to POST /close: {text[:300]}"
            )


def answer_object(status: int, text: str, where: str, route: str) -> dict[str, Any]:
    """A server's answer to ``POST /<route>`` as a JSON object; an HTTP error or any other
    body raises ``ResetStepError`` naming the server and the route."""
    if status >= 400:
        raise ResetStepError(f"{where} answered HTTP {status} to POST /{route}: {text[:500]}")
    answer = json_object(text)
    if answer is None:
        raise ResetStepError(f"{where} answered POST /{route} with no JSON object: {text[:300]}")
    return answer


def _observation(answer: dict[str, Any]) -> list[Message]:
    """What the model reads next: the tool outputs as tool messages, then the observation
    as a user message (the order NeMo Gym's gymnasium_agent appends them in)."""
    messages = []
    info = answer.get("info")
    outputs = info.get("tool_outputs") if isinstance(info, dict) else None
    for output in outputs if isinstance(outputs, list) else []:
        if isinstance(output, dict) and output.get("call_id") is not None:
            content = output.get("output")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            messages.append(Message(role="tool", tool_call_id=str(output["call_id"]), content=text))
    observation = answer.get("observation")
    if observation:
        messages.append(Message(role="user", content=str(observation)))
    return messages
