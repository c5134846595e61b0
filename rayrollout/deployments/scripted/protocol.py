"""The scripted policy's answers in the OpenAI protocol, whoever serves them.

The one writer of these shapes: the Serve app (``server``), the actor-hosted server
(``actor_server``), the in-process policy (``local``), the benchmarks' stub policy and the
tests' flaky policy all answer with them, so a change to the protocol is made once. Nothing
here imports a server framework.
"""

from __future__ import annotations

import time
from typing import Any

from rayrollout.deployments.scripted.strategy import Action, next_action

__all__ = [
    "chat_answer",
    "chat_completion",
    "models_answer",
    "responses_answer",
    "responses_messages",
]


def _words(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "").split()) for m in messages)


def _responses_input_to_chat(items: Any) -> list[dict[str, Any]]:
    """Responses-API input items as chat messages, enough for the strategy to read."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            messages.append(
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": item.get("call_id"),
                            "type": "function",
                            "function": {
                                "name": item["name"],
                                "arguments": item.get("arguments", ""),
                            },
                        }
                    ],
                }
            )
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": item.get("output", ""),
                }
            )
        else:
            messages.append({"role": item.get("role", "user"), "content": item.get("content", "")})
    return messages


def _output_item(action: Action, n: int) -> dict[str, Any]:
    if action.tool:
        return {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": action.tool,
            "arguments": action.arguments,
            "status": "completed",
        }
    return {
        "type": "message",
        "id": f"msg_{n}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": action.text, "annotations": []}],
    }


def _usage(prompt: int, completion: int, prompt_key: str, completion_key: str) -> dict[str, int]:
    return {prompt_key: prompt, completion_key: completion, "total_tokens": prompt + completion}


def _completion_words(action: Action) -> int:
    """The reply's usage count: words of the answer or of the tool call's arguments."""
    return len((action.text or action.arguments).split())


def chat_completion(
    action: Action, n: int, model: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """``action`` as a Chat Completions answer, in the exact shape the ``openai`` client parses.

    ``n`` numbers the answer and its tool call.
    """
    message: dict[str, Any] = {"role": "assistant", "content": action.text}
    if action.tool:
        message["tool_calls"] = [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": action.tool, "arguments": action.arguments},
            }
        ]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if action.tool else "stop",
            }
        ],
        "usage": _usage(prompt_tokens, completion_tokens, "prompt_tokens", "completion_tokens"),
    }


def models_answer(model: str) -> dict[str, Any]:
    """``GET /v1/models``: the one model this policy is."""
    return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "rayrollout"}]}


def chat_answer(body: dict[str, Any], model: str, n: int) -> dict[str, Any]:
    """``POST /v1/chat/completions``: the strategy's next move for the request ``body``."""
    messages = body.get("messages") or []
    action = next_action(messages, body.get("tools") or [])
    return chat_completion(
        action, n, body.get("model", model), _words(messages), _completion_words(action)
    )


def responses_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses request's input as chat messages (what the strategy and think time read)."""
    return _responses_input_to_chat(body.get("input") or [])


def responses_answer(body: dict[str, Any], model: str, n: int) -> dict[str, Any]:
    """``POST /v1/responses``: the strategy's next move for the request ``body``."""
    messages = responses_messages(body)
    tools = [{"type": "function", "function": t} for t in body.get("tools") or []]
    action = next_action(messages, tools)
    completion = _completion_words(action)
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": int(time.time()),
        "model": body.get("model", model),
        "status": "completed",
        "output": [_output_item(action, n)],
        "parallel_tool_calls": False,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": {
            **_usage(_words(messages), completion, "input_tokens", "output_tokens"),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
