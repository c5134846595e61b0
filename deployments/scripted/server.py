"""The scripted policy as a Ray Serve application speaking OpenAI's HTTP protocol.

Routes: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``GET /v1/models``. Responses
carry usage counts (words, as a stand-in for tokens) and, for chat, the message and tool
calls in the exact shape the ``openai`` client parses. Like every rayrollout route, they
take only bearers of the run's token (``rayrollout.auth``): the workers send it as their key.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures' types.
# Helpers sit above the deployment: Serve serializes the class with the globals it sees.
import asyncio
import itertools
import time
from typing import Any

from fastapi import FastAPI, Request
from ray import serve
from rayrollout.deployments.scripted.strategy import Action, next_action, requested_sleep

from rayrollout.auth import BearerTokenGate, RouteAuth

app = FastAPI(title="rayrollout scripted policy")
app.add_middleware(BearerTokenGate)
_ids = itertools.count()


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

    The one writer of that shape: the Serve app below, the benchmarks' stub policy and the
    tests' flaky policy all answer with it, so a change to the protocol is made once.
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


@serve.deployment(
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=100_000,
    logging_config={"log_level": "WARNING", "enable_access_log": False},
)
@serve.ingress(app)
class ScriptedPolicy:
    """Plays ``strategy.next_action`` behind the OpenAI protocol."""

    def __init__(
        self, latency_s: float = 0.0, model: str = "scripted", auth: RouteAuth | None = None
    ) -> None:
        if auth is not None:  # none given: the routes refuse every request
            auth.install()
        self.latency_s = latency_s
        self.model = model

    async def _think(self, messages: list[dict[str, Any]]) -> None:
        delay = self.latency_s + requested_sleep(messages)
        if delay:
            await asyncio.sleep(delay)

    @app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "owned_by": "rayrollout"}],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        messages = body.get("messages") or []
        await self._think(messages)
        action = next_action(messages, body.get("tools") or [])
        model = body.get("model", self.model)
        return chat_completion(
            action, next(_ids), model, _words(messages), _completion_words(action)
        )

    @app.post("/v1/responses")
    async def responses(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        messages = _responses_input_to_chat(body.get("input") or [])
        await self._think(messages)
        tools = [{"type": "function", "function": t} for t in body.get("tools") or []]
        action = next_action(messages, tools)
        n = next(_ids)
        output = [_output_item(action, n)]
        completion = _completion_words(action)
        return {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model", self.model),
            "status": "completed",
            "output": output,
            "parallel_tool_calls": False,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": {
                **_usage(_words(messages), completion, "input_tokens", "output_tokens"),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }


def scripted_policy_app(
    replicas: int = 1,
    latency_s: float = 0.0,
    model: str = "scripted",
    ray_actor_options: dict[str, Any] | None = None,
    *,
    auth: RouteAuth,
) -> serve.Application:
    """The scripted policy application, ready for ``serve.run``.

    ``ray_actor_options`` places the replicas (``rayrollout.engine.placement``: GPU-node role);
    ``auth`` says which bearer token its routes take (``RouteAuth.open()``: any request).
    """
    options: dict[str, Any] = {"num_replicas": replicas}
    if ray_actor_options:
        options["ray_actor_options"] = ray_actor_options
    return ScriptedPolicy.options(**options).bind(latency_s=latency_s, model=model, auth=auth)
