"""Conversions between Chat Completions messages and Responses-API items and tools.

Trajectories keep chat messages; the Responses API is spoken at the policy boundary (and by
NeMo Gym rows), so both directions live here, in one place.
"""

from __future__ import annotations

import json
from typing import Any

from rayrollout.data.schema import FunctionCall, Message, ToolCall

__all__ = [
    "chat_tools_to_responses",
    "json_or_text",
    "messages_to_responses_input",
    "responses_output_to_message",
    "tool_output",
]


def chat_tools_to_responses(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat function tools (``{"type", "function": {...}}``) in Responses form (flat).

    ``strict`` is always present (``None`` when the schema does not say): the Responses
    API's ``FunctionToolParam`` requires the key, and NeMo Gym's request models reject a
    tool without it.
    """
    return [{"type": "function", "strict": None, **tool["function"]} for tool in tools]


def tool_output(message: Message) -> str | list[dict[str, Any]]:
    """A tool message as a ``function_call_output``'s ``output``: its text, or its parts
    (``input_text`` and ``input_image`` items) when it returned images."""
    if message.parts is not None:
        return [part.to_responses() for part in message.parts]
    return message.content or ""


def messages_to_responses_input(messages: list[Message]) -> list[dict[str, Any]]:
    """Chat messages as Responses-API input items, tool calls and outputs included; a
    message with images sends its parts (``input_image`` items with their URLs)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": tool_output(message),
                }
            )
            continue
        if message.parts is not None:
            content = [part.to_responses(message.role) for part in message.parts]
            items.append({"type": "message", "role": message.role, "content": content})
        elif message.content:
            items.append({"type": "message", "role": message.role, "content": message.content})
        for call in message.tool_calls or []:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.function.name,
                    "arguments": call.function.arguments,
                }
            )
    return items


def responses_output_to_message(output: list[dict[str, Any]]) -> Message:
    """A Responses-API ``output`` list as one assistant chat message."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") in ("output_text", "text"):
                    texts.append(part.get("text", ""))
        elif kind == "function_call":
            calls.append(
                ToolCall(
                    id=item.get("call_id") or item.get("id") or f"call_{len(calls)}",
                    function=FunctionCall(name=item["name"], arguments=item.get("arguments") or ""),
                )
            )
    return Message(role="assistant", content="".join(texts) or None, tool_calls=calls or None)


# The first character of JSON text that holds each kind: text starting otherwise cannot.
_JSON_OPENERS: dict[type, str] = {str: '"', dict: "{", list: "["}


def json_or_text(text: str, kind: type) -> Any:
    """``text`` decoded from JSON when it holds a ``kind``, else ``text`` as it is.

    Tool-call arguments as an object (``dict``) for chat templates, a tool's JSON-string
    output unwrapped (``str``) for the model: text that is not JSON, or JSON of another
    kind, stays the text it was.
    """
    # Text that cannot hold the kind is not parsed: a tool's plain-text answer, the common
    # case on every NeMo Gym tool call, would otherwise cost a failed parse and its error.
    opener = _JSON_OPENERS.get(kind)
    if opener is not None and not text.lstrip().startswith(opener):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, kind) else text
