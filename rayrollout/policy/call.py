"""What one policy call takes and gives: ``PolicyRequest`` in, ``PolicyReply`` out.

One object each way, so that a policy kind implements ``complete(request)`` and a new input
of a call (a field with a default) reaches every kind without a change to their signatures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rayrollout.data.schema import Message, SamplingParams, Turn

__all__ = ["PolicyReply", "PolicyRequest"]


@dataclass(slots=True)
class PolicyRequest:
    """One model call of an episode.

    ``history`` (the episode's earlier turns of this sequence) gives ``prompt_mode:
    token_ids`` the kept ids; ``last_turn`` switches ``tool_choice: required`` to
    ``last_turn_tool_choice``; ``session_id`` (the episode id) routes every turn of an
    episode to one replica.
    """

    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    sampling: SamplingParams | None = None
    session_id: str | None = None
    history: list[Turn] = field(default_factory=list)
    last_turn: bool = False


@dataclass
class PolicyReply:
    """The assistant message and the turn's record (ids, logprobs, version, timings)."""

    message: Message
    turn: Turn
    text: str | None = None
    """The completion's raw text (token-ids mode): what a continuation appends to."""
