"""A policy server that answers with token ids and logprobs, as vLLM does: the scripted
strategy (the model's judgement) behind Chat Completions over real HTTP, plus
``prompt_token_ids``, each choice's ``token_ids`` and per-token ``logprobs``.

Its "tokenizer" gives one id per word of a message (the role first, then the content's words,
then each tool call's name and arguments), so the ids of a conversation are the ids of its
messages end to end: a later call's prompt extends the earlier prompt and completion exactly,
as a real chat template's does. Each id's logprob is a function of the id, so a test can
recompute it. It runs on a thread of the test process; engines in Ray actors reach it like
any external endpoint.
"""

from __future__ import annotations

import itertools
import json
import zlib
from typing import Any

from aiohttp import web
from netutil import AiohttpInThread

from rayrollout.deployments.scripted.protocol import chat_completion
from rayrollout.deployments.scripted.strategy import next_action


def word_id(word: str) -> int:
    return 1 + zlib.crc32(word.encode()) % 50_000


def message_ids(message: dict[str, Any]) -> list[int]:
    words = [str(message.get("role"))]
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    words += str(content or "").split()
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        words.append(f"{function.get('name')}{function.get('arguments')}")
    return [word_id(w) for w in words]


def conversation_ids(messages: list[dict[str, Any]]) -> list[int]:
    return [i for m in messages for i in message_ids(m)]


def logprob(token_id: int) -> float:
    return -((token_id % 97) + 1) / 100


class TokenPolicy(AiohttpInThread):
    """Chat Completions with token ids and logprobs on 127.0.0.1 (``base_url``)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0
        self._ids = itertools.count()

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.Response:
        self.requests += 1
        body = await request.json()
        messages = body.get("messages") or []
        action = next_action(messages, body.get("tools") or [])
        prompt = conversation_ids(messages)
        answer = chat_completion(action, next(self._ids), body.get("model", "tokens"), 0, 0)
        choice = answer["choices"][0]
        completion = message_ids(choice["message"])
        answer["prompt_token_ids"] = prompt
        choice["token_ids"] = completion
        choice["logprobs"] = {
            "content": [{"token": str(t), "logprob": logprob(t)} for t in completion]
        }
        answer["usage"] = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(completion),
            "total_tokens": len(prompt) + len(completion),
        }
        return web.Response(text=json.dumps(answer), content_type="application/json")
