"""What a worker's first model call waits for: nothing that could have been loaded at start.

A worker's first chunk of episodes used to pay for one-time loads on its event loop: the
token-ids client's tokenizer (``transformers``' import, seconds) and Arrow's lazy imports at
the first table. Every episode of the chunk waited, so vLLM saw that worker's requests
trickle in during a run's first round. Here: both are loaded when the client or worker is
made, and the request a token-ids call sends is what vLLM is meant to get.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from netutil import served_routes

import rayrollout.policy.client as client_module
from rayrollout.data.config import PolicyConfig
from rayrollout.data.schema import Message
from rayrollout.policy.call import PolicyRequest
from rayrollout.policy.client import PolicyClient, PolicyError
from rayrollout.policy.tokens import TemplateError

PROMPT_IDS = [5, 6, 7]


@pytest.fixture
async def completions() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A /v1/completions server that records each request (body and headers)."""
    seen: list[dict[str, Any]] = []

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"body": body, "headers": dict(request.headers)})
        answer = {
            "choices": [
                {
                    "text": "ok",
                    "token_ids": [8, 9],
                    "prompt_token_ids": body["prompt"],
                    "finish_reason": "length",
                    "logprobs": {"token_logprobs": [-0.5, -0.25]},
                }
            ],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 2},
        }
        return web.json_response(answer)

    async with served_routes({"/v1/completions": complete}) as base_url:
        yield base_url, seen


def token_ids_config(**fields: Any) -> PolicyConfig:
    return PolicyConfig(
        kind="openai", model="m", tokenizer="tok", prompt_mode="token_ids", **fields
    )


async def test_a_token_ids_client_loads_its_tokenizer_when_made_not_at_its_first_call(
    monkeypatch, completions
):
    url, seen = completions
    loads: list[str] = []

    def load(name: str) -> Any:
        loads.append(name)

        async def tokenize(body: dict[str, Any]) -> list[int]:
            return PROMPT_IDS

        return tokenize

    monkeypatch.setattr(client_module, "chat_template_tokenizer", load)
    policy = PolicyClient(
        token_ids_config(max_tokens=4, temperature=1.0, extra_body={"ignore_eos": True}), url
    )
    assert loads == ["tok"]  # made with the client, before any call
    try:
        reply = await policy.complete(
            PolicyRequest([Message(role="user", content="hi")], session_id="episode-1")
        )
    finally:
        await policy.close()
    assert loads == ["tok"]  # the call did not load it again
    assert reply.turn.prompt_token_ids == PROMPT_IDS
    assert reply.turn.completion_token_ids == [8, 9]
    # What vLLM is asked for: the ids, the sampling given, the sampled tokens' logprobs and
    # ids, nothing more (no top_p the config left unset, no structured output with no tools).
    (request,) = seen
    assert request["body"] == {
        "model": "m",
        "prompt": PROMPT_IDS,
        "max_tokens": 4,
        "temperature": 1.0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_token_ids": True,
    }
    assert request["headers"]["x-session-id"] == "episode-1"


async def test_a_tokenizer_that_cannot_load_fails_the_call_not_the_client(monkeypatch):
    def load(name: str) -> Any:
        raise TemplateError(f"cannot load the tokenizer {name!r}")

    monkeypatch.setattr(client_module, "chat_template_tokenizer", load)
    policy = PolicyClient(token_ids_config(), "http://127.0.0.1:9/v1")  # no error here
    try:
        with pytest.raises(PolicyError, match="cannot load the tokenizer 'tok'"):
            await policy.complete(PolicyRequest([Message(role="user", content="hi")]))
    finally:
        await policy.close()


def test_a_worker_actor_pays_arrows_lazy_imports_when_made():
    """Arrow imports pandas and its compute module at the first table it builds; a worker
    builds one per finished batch, so it must have done so before its first chunk."""
    script = """
import sys
from rayrollout.data.config import RunConfig
from rayrollout.engine.worker import WorkerActor, WorkerSpec
assert "pandas" not in sys.modules, "imported before the worker was made: test is moot"
config = RunConfig.model_validate(
    {"policy": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}}
)
WorkerActor.__ray_actor_class__(WorkerSpec("worker:0", config, "http://127.0.0.1:9/v1"))
assert "pandas" in sys.modules and "pyarrow.compute" in sys.modules
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
