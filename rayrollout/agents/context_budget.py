"""The tool loop under a prompt budget: old tool calls and their results are dropped.

A long tool episode outgrows the model's context (or the budget a trainer allows a prompt).
This agent plays the tool loop, but before each model call it estimates the prompt's size,
and when that passes ``max_prompt_tokens`` it drops the oldest tool groups (an assistant
message that called tools, with the tool messages answering it), keeping the system and
user messages, the assistant's plain answers and the last ``keep_last_turns`` groups, and
puts one short note where they were saying how many messages went.

What is recorded (see ``rayrollout.agentkit.episode``):

* ``episode.messages``, the transcript the verifier reads, stays whole: trimming only
  changes the list the model is shown.
* Until the first trim the model is shown the transcript itself: each turn records
  ``prompt_message_count`` and extends the one before, as in the tool loop.
* A trimmed call sends a new list (``sent_messages`` recorded): ``extends_previous`` is
  False and a new token sequence starts, rendered afresh.
* The calls after it are shown that same list grown by each reply and its tool results, so
  they extend it again (``extends_previous`` True, one token sequence, the server's prefix
  cache reused) until the budget is passed again and the next trim starts another sequence.

Every old group goes at once (not one per call), so a trim buys room for several extending
calls instead of starting a new sequence on every call.

The size estimate: the last call's ``prompt_tokens`` + ``completion_tokens`` as the server
counted them, plus about ``len(text) / 4`` tokens for each message added since; with no
counts (the first call, a server that gives none), ``len(text) / 4`` for the whole prompt,
tool schemas included. The budget is therefore approximate: keep it well under the model's
context window.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from rayrollout.agentkit import Agent, AgentEpisode
from rayrollout.data.schema import Message, Turn

CHARS_PER_TOKEN = 4  # a rough average for English text and JSON with BPE tokenizers
MESSAGE_OVERHEAD = 4  # role markers and separators a chat template adds per message


class ContextBudget(Agent):
    """The tool loop, dropping the oldest tool calls and results past a prompt budget."""

    def __init__(
        self,
        max_prompt_tokens: int = 2048,
        keep_last_turns: int = 1,
        note_role: Literal["user", "system"] = "user",
    ) -> None:
        """``keep_last_turns``: the newest tool groups never dropped. ``note_role``: the
        note's role; a user message by default, since many chat templates refuse a system
        message anywhere but first."""
        if max_prompt_tokens < 1 or keep_last_turns < 0:
            raise ValueError("max_prompt_tokens must be >= 1 and keep_last_turns >= 0")
        if note_role not in ("user", "system"):
            raise ValueError(f"note_role must be 'user' or 'system', not {note_role!r}")
        self.max_prompt_tokens = max_prompt_tokens
        self.keep_last_turns = keep_last_turns
        self.note_role = note_role

    async def play(self, episode: AgentEpisode) -> None:
        shown = episode.messages  # what the model is shown: the transcript until a trim
        last: Turn | None = None  # the previous call's record (its token counts)
        sent = 0  # how many messages of ``shown`` the previous call sent
        while True:
            if estimate(shown, sent, last, episode.tools) > self.max_prompt_tokens:
                trimmed = self.trim(episode.messages)
                if trimmed is not None:
                    shown = trimmed
            sent = len(shown)
            reply = await episode.model(shown)  # raises OutOfTurns past max_turns
            last = episode.trajectory.turns[-1]
            episode.messages.append(reply)
            if shown is not episode.messages:
                shown.append(reply)
            if not reply.tool_calls:
                return
            answers = await episode.run_tools(reply)  # appended to the transcript
            if shown is not episode.messages:
                shown.extend(answers)

    def trim(self, transcript: list[Message]) -> list[Message] | None:
        """A new list: the transcript without its tool groups but the last
        ``keep_last_turns``, a note in place of the first dropped; None when none can go."""
        groups = tool_groups(transcript)
        dropped = groups[: max(0, len(groups) - self.keep_last_turns)]
        if not dropped:
            return None
        gone = {i for start, end in dropped for i in range(start, end)}
        note = Message(
            role=self.note_role,
            content=f"[{len(gone)} earlier messages (tool calls and results) were dropped "
            "to fit the context budget.]",
        )
        first = dropped[0][0]
        shown = []
        for i, message in enumerate(transcript):
            if i == first:
                shown.append(note)
            if i not in gone:
                shown.append(message)
        return shown


def tool_groups(messages: list[Message]) -> list[tuple[int, int]]:
    """``(start, end)`` of each assistant message with tool calls and the tool messages
    right after it, oldest first."""
    groups = []
    i = 0
    while i < len(messages):
        if messages[i].role == "assistant" and messages[i].tool_calls:
            end = i + 1
            while end < len(messages) and messages[end].role == "tool":
                end += 1
            groups.append((i, end))
            i = end
        else:
            i += 1
    return groups


def estimate(
    shown: list[Message], sent: int, last: Turn | None, tools: list[dict[str, Any]]
) -> int:
    """Tokens of a prompt of ``shown``: the previous call's counts plus the messages after
    its reply, else a character estimate of everything (see the module's docstring)."""
    if last is not None and last.prompt_tokens > 0:
        return last.prompt_tokens + last.completion_tokens + rough_tokens(shown[sent + 1 :])
    schemas = len(json.dumps(tools)) // CHARS_PER_TOKEN if tools else 0
    return schemas + rough_tokens(shown)


def rough_tokens(messages: list[Message]) -> int:
    """About ``len(text) / 4`` tokens per message, tool calls included."""
    total = 0
    for message in messages:
        chars = len(message.content or "")
        for call in message.tool_calls or []:
            chars += len(call.function.name) + len(call.function.arguments)
        total += chars // CHARS_PER_TOKEN + MESSAGE_OVERHEAD
    return total
