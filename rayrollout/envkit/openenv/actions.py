"""Between the model's chat and OpenEnv's actions and observations.

**MCP tools** environments offer their tools as function tools, each tool call one
``CallToolAction`` step. **Typed actions** environments take the reply's text as one JSON
action; the observation's fields are the next user message.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from rayrollout.data.json_text import json_object
from rayrollout.data.schema import Message
from rayrollout.envkit.openenv.channel import ActionRejected, OpenEnvError

__all__ = [
    "chat_tools",
    "is_tool_schema",
    "json_action",
    "observation_text",
    "rejected",
    "schema_note",
    "tool_output",
]

_FENCE = re.compile(r"```(?:json)?\s*(\{.*\})\s*```", re.DOTALL)


def is_tool_schema(schema: dict[str, Any]) -> bool:
    """Whether an action schema is OpenEnv's MCP ``CallToolAction`` (a ``tool_name`` field)."""
    properties = schema.get("properties")
    return isinstance(properties, dict) and "tool_name" in properties


def chat_tools(observation: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """``ListToolsObservation``'s tools as OpenAI chat function tools."""
    tools = observation.get("tools")
    if not isinstance(tools, list):
        raise OpenEnvError(f"{where} answered list_tools with no 'tools' list")
    offered = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("name"):
            parameters = tool.get("input_schema") or tool.get("inputSchema") or {}
            function = {
                "name": str(tool["name"]),
                "description": str(tool.get("description") or ""),
                "parameters": parameters or {"type": "object", "properties": {}},
            }
            offered.append({"type": "function", "function": function})
    return offered


def tool_output(observation: dict[str, Any]) -> str:
    """A ``CallToolObservation`` as the text the model reads: the tool's text content (its
    ``data`` where it has none), or its error."""
    error = observation.get("error")
    if isinstance(error, dict) and error:
        return f"Error ({error.get('error_type', 'error')}): {error.get('message', '')}"
    result = observation.get("result")
    if isinstance(result, dict):
        texts = [
            str(item.get("text"))
            for item in result.get("content") or []
            if isinstance(item, dict) and item.get("type") == "text"
        ]
        if texts:
            prefix = "Error: " if result.get("is_error") else ""
            return prefix + "\n".join(texts)
        if result.get("data") is not None:
            result = result["data"]
    return result if isinstance(result, str) else orjson.dumps(result).decode()


def json_action(text: str | None) -> dict[str, Any]:
    """The reply's action: its text as one JSON object (or the object in a ```json fence)."""
    body = (text or "").strip()
    fenced = _FENCE.search(body)
    if fenced:
        body = fenced.group(1)
    action = json_object(body)
    if action is None:
        raise ActionRejected(f"the reply is not one JSON object: {body[:200]!r}")
    return action


def observation_text(observation: dict[str, Any]) -> str:
    """A typed observation's fields (its ``metadata`` left out) as the next user message."""
    fields = {k: v for k, v in observation.items() if k != "metadata"}
    if len(fields) == 1:
        (value,) = fields.values()
        if isinstance(value, str):
            return value
    return orjson.dumps(fields).decode() if fields else ""


def schema_note(schema: dict[str, Any]) -> str:
    """What the model is told about a typed action: answer one JSON object of this schema."""
    shown = {k: v for k, v in schema.items() if k not in ("title", "description")}
    properties = dict(shown.get("properties") or {})
    properties.pop("metadata", None)  # OpenEnv's bookkeeping field, never the model's
    shown["properties"] = properties
    return (
        "Answer with one JSON object, the action, matching this JSON schema: "
        + orjson.dumps(shown).decode()
    )


def rejected(why: str) -> Message:
    """What the model reads when its action was refused (nothing was stepped)."""
    return Message(role="user", content=f"That action was not taken: {why}")
