"""The OpenAI request and answer shapes the recording gateway reads and writes.

Pure functions, no HTTP: a program's messages, tools and sampling fields read into
rayrollout's types (leniently, as OpenAI SDKs send nulls back), the episode's reply written
as a ``chat.completion`` or a ``response``; what cannot be read is a ``BadRequest`` (400).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import ValidationError

from rayrollout.agentkit.errors import BadRequest
from rayrollout.data.schema import FunctionCall, Message, SamplingParams, ToolCall, Turn

__all__ = [
    "BadRequest",
    "chat_completion",
    "chat_messages",
    "chat_tools",
    "responses_response",
    "responses_tools",
    "sampling_over",
]


# Chat roles a program may send -> ours ("developer" is the newer name of "system").
_CHAT_ROLES: dict[str, Literal["system", "user", "assistant", "tool"]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


_IMAGE_PARTS = ("image_url", "input_image")


def _text(content: Any, where: str) -> str | list[Any] | None:
    """A message's content as ours: a string, null, a list of text parts (joined), or, when
    it shows images, the list of parts itself (the message keeps them as parts)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        if any(isinstance(p, dict) and p.get("type") in _IMAGE_PARTS for p in content):
            return content
        texts = []
        for i, part in enumerate(content):
            text = part.get("text") if isinstance(part, dict) else part
            if not isinstance(text, str):
                raise BadRequest(f"{where}[{i}]", "only text and image parts are supported")
            texts.append(text)
        return "\n".join(texts)
    raise BadRequest(where, "must be a string, null or a list of text and image parts")


def _tool_calls(raw: Any, where: str) -> list[ToolCall] | None:
    if not raw:
        return None
    if not isinstance(raw, list):
        raise BadRequest(where, "must be a list")
    calls = []
    for i, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(
                f"{where}[{i}]", "must be {id, type: function, function: {name, arguments}}"
            )
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # some clients send the object itself
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append(
            ToolCall(
                id=str(call.get("id") or f"call_{i}"),
                function=FunctionCall(name=function["name"], arguments=arguments),
            )
        )
    return calls


def chat_messages(raw: Any) -> list[Message]:
    """Chat Completions ``messages`` as ours, leniently: unknown keys (the SDK's ``refusal``,
    ``annotations``, ``audio``, ``function_call``) are dropped, text parts joined. Raises a
    400 naming the message that cannot be read."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages", "must be a non-empty list of messages")
    messages = []
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(where, "must be an object")
        role = _CHAT_ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise BadRequest(f"{where}.role", f"must be one of {sorted(_CHAT_ROLES)}")
        fields: dict[str, Any] = {"role": role, "content": _text(item.get("content"), where)}
        if role == "assistant":
            fields["tool_calls"] = _tool_calls(item.get("tool_calls"), f"{where}.tool_calls")
        elif role == "tool":
            fields["tool_call_id"] = item.get("tool_call_id")
            fields["name"] = item.get("name")
        try:
            messages.append(Message.model_validate(fields))
        except ValidationError as exc:
            raise BadRequest(where, exc.errors()[0]["msg"]) from None
    return messages


def _tool_list(raw: Any) -> list[Any]:
    """A request's ``tools`` as a list (empty when absent), before each tool is read."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("tools", "must be a list of function tools")
    return raw


def chat_tools(raw: Any) -> list[dict[str, Any]]:
    """Chat ``tools`` as given (an empty list when none: the program offers none)."""
    raw = _tool_list(raw)
    for i, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(
                f"tools[{i}]", "must be {type: function, function: {name, parameters}}"
            )
    return raw


def responses_tools(raw: Any) -> list[dict[str, Any]]:
    """Responses-API function tools (flat) in chat form, as the episode's model takes them."""
    tools = []
    for i, tool in enumerate(_tool_list(raw)):
        if not isinstance(tool, dict) or tool.get("type") != "function" or "name" not in tool:
            raise BadRequest(
                f"tools[{i}]", "only function tools {type: function, name, parameters}"
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        tools.append({"type": "function", "function": function})
    return tools


def sampling_over(
    task: SamplingParams | None, body: dict[str, Any], max_keys: dict[str, str]
) -> SamplingParams | None:
    """The request's sampling over the task's (field by field); None: the task's as it is.
    ``max_keys`` maps the API's name of the token limit to ours."""
    given: dict[str, Any] = {
        k: body[k] for k in ("temperature", "top_p", "seed") if body.get(k) is not None
    }
    names = {k: k for k in given}
    for key, ours in max_keys.items():
        if body.get(key) is not None:
            given[ours], names[ours] = body[key], key
            break
    if not given:
        return None
    base = task.model_dump(exclude_none=True) if task is not None else {}
    try:
        return SamplingParams.model_validate({**base, **given})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = str(error["loc"][0]) if error["loc"] else "sampling"
        raise BadRequest(names.get(where, where), error["msg"]) from None


def _usage(turn: Turn) -> tuple[int, int]:
    return turn.prompt_tokens, turn.completion_tokens


def chat_completion(reply: Message, turn: Turn, model: str) -> dict[str, Any]:
    """The reply as a ``chat.completion`` object, in the shape the OpenAI SDK parses."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [call.model_dump() for call in reply.tool_calls]
    finish = turn.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    prompt, completion = _usage(turn)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _output_items(reply: Message) -> list[dict[str, Any]]:
    """The reply as Responses-API output items: its text as a message, each tool call as a
    function_call (what ``items_to_messages`` reads back as this same reply)."""
    items: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": reply.content or "", "annotations": []}
                ],
            }
        )
    for call in reply.tool_calls or []:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
                "status": "completed",
            }
        )
    return items


def responses_response(
    response_id: str, reply: Message, turn: Turn, model: str, body: dict[str, Any]
) -> dict[str, Any]:
    """The reply as a Responses-API ``response`` object."""
    prompt, completion = _usage(turn)
    truncated = turn.finish_reason == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "output": _output_items(reply),
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "usage": {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": prompt + completion,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
