"""The scripted policy as a Ray Serve application speaking OpenAI's HTTP protocol.

Routes: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``GET /v1/models``. Responses
carry usage counts (words, as a stand-in for tokens) and, for chat, the message and tool
calls in the exact shape the ``openai`` client parses (``protocol``). Like every rayrollout
route, they take only bearers of the run's token (``rayrollout.auth``): the workers send it
as their key. ``actor_server`` serves the same answers from a plain Ray actor, without Serve.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures' types.
import asyncio
import itertools
from typing import Any

from fastapi import FastAPI, Request
from ray import serve

from rayrollout.auth import BearerTokenGate, RouteAuth
from rayrollout.deployments.scripted.protocol import (
    chat_answer,
    models_answer,
    responses_answer,
    responses_messages,
)
from rayrollout.deployments.scripted.strategy import requested_sleep

app = FastAPI(title="rayrollout scripted policy")
app.add_middleware(BearerTokenGate)
_ids = itertools.count()


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
        return models_answer(self.model)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        await self._think(body.get("messages") or [])
        return chat_answer(body, self.model, next(_ids))

    @app.post("/v1/responses")
    async def responses(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        await self._think(responses_messages(body))
        return responses_answer(body, self.model, next(_ids))


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
    deployment: Any = ScriptedPolicy
    return deployment.options(**options).bind(latency_s=latency_s, model=model, auth=auth)
