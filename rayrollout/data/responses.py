"""The episode in the Responses API's shapes, as NeMo Gym's servers and files carry it.

NeMo Gym rows hold the request as ``responses_create_params`` and its servers verify a
Responses-API ``response``; rayrollout keeps chat messages. These functions convert between
the two and build the bodies NeMo Gym's agents send, so that task reading, export and the
resources-server client and routes all speak one conversion.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from rayrollout.data.convert import chat_tools_to_responses, messages_to_responses_input
from rayrollout.data.convert import tool_output as _tool_output
from rayrollout.data.schema import FunctionCall, Message, Task, ToolCall

__all__ = ["episode_response", "items_to_messages", "responses_create_params", "seed_body"]

# Responses-API message roles -> chat roles ("developer" is the Responses API's "system").
_CHAT_ROLES: dict[str, Literal["system", "user", "assistant"]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


def responses_create_params(task: Task) -> dict[str, Any]:
    """The task's ``responses_create_params``: the row's own for NeMo Gym rows, else built.

    NeMo Gym verifiers read fields of the original request (``input``, ``tools``, sampling),
    so a NeMo Gym row's own object is sent back unchanged.
    """
    own = task.fields.get("responses_create_params")
    if isinstance(own, dict):
        return own
    params: dict[str, Any] = {"input": messages_to_responses_input(task.prompt)}
    if task.tools is not None:
        params["tools"] = chat_tools_to_responses(task.tools)
    return params


def seed_body(task: Task) -> dict[str, Any]:
    """The body of ``/seed_session``: the task row as NeMo Gym agents send it."""
    body = {k: v for k, v in task.fields.items() if k != "responses_create_params"}
    return {"responses_create_params": responses_create_params(task), **body}


def episode_response(task: Task, messages: list[Message], model: str = "") -> dict[str, Any]:
    """The episode as a Responses-API ``response`` object, as ``/verify`` expects it.

    ``output`` holds what happened after the prompt, in order: ``function_call`` items for
    the model's tool calls, ``function_call_output`` items for the tools' answers, and
    ``message`` items for the model's text.
    """
    output: list[dict[str, Any]] = []
    for i, message in enumerate(messages[len(task.prompt) :]):
        if message.role == "tool":
            output.append(
                {
                    "type": "function_call_output",
                    "id": f"fco_{i}",
                    "call_id": message.tool_call_id or f"call_{i}",
                    "output": _tool_output(message),
                    "status": "completed",
                }
            )
        elif message.role == "assistant":
            if message.content:
                output.append(
                    {
                        "type": "message",
                        "id": f"msg_{i}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [
                            {"type": "output_text", "text": message.content, "annotations": []}
                        ],
                    }
                )
            for j, call in enumerate(message.tool_calls or []):
                output.append(
                    {
                        "type": "function_call",
                        "id": f"fc_{i}_{j}",
                        "call_id": call.id,
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                        "status": "completed",
                    }
                )
    tools = chat_tools_to_responses(task.tools or [])
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": tools,
    }


def _shows_image(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") in ("input_image", "image_url", "image")
        for p in content
    )


def _item_content(content: Any) -> Any:
    """Item content as a message takes it: the parts when they show an image (the message
    keeps them), else the text."""
    return content if _shows_image(content) else _item_text(content)


def _item_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def items_to_messages(items: Any) -> list[Message]:
    """Responses-API items (request ``input`` or response ``output``) as chat messages.

    Consecutive ``function_call`` items become one assistant message with several tool
    calls, joined to the assistant text just before them; ``developer`` reads as
    ``system``; items without a chat equivalent (reasoning) are left out.
    """
    if isinstance(items, str):
        return [Message(role="user", content=items)]
    messages: list[Message] = []
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or "message"  # null in Parquet rows whose items differ
        if kind == "function_call":
            call = ToolCall(
                id=str(item.get("call_id") or item.get("id") or f"call_{len(messages)}"),
                function=FunctionCall(
                    name=str(item.get("name", "")), arguments=str(item.get("arguments") or "")
                ),
            )
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(Message(role="assistant", tool_calls=[call]))
        elif kind == "function_call_output":
            output = item.get("output", "")
            messages.append(
                Message(
                    role="tool",
                    tool_call_id=str(item.get("call_id", "")),
                    content=output if isinstance(output, str) else _item_content(output),
                )
            )
        elif kind == "message":
            role = _CHAT_ROLES.get(str(item.get("role", "user")))
            if role is not None:  # other roles have no chat equivalent
                messages.append(Message(role=role, content=_item_content(item.get("content"))))
    return messages
