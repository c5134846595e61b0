"""The scripted policy served by one plain Ray actor (aiohttp), without Ray Serve.

Serve puts an HTTP app up through three processes started one after another (its
controller, its proxy, the replica): seconds of a small run's start on a laptop, spent on a
stand-in for a model. This actor answers the same routes with the same shapes
(``protocol``), behind the same bearer token, from one process that starts beside the
engine. ``policy.scripted.hosting: actor`` picks it (the demo's default); it lives as long as
the driver that started it, so a detached engine (``rayrollout up``) keeps Serve.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
import ray
from aiohttp import web
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayrollout.auth import RouteAuth
from rayrollout.deployments.scripted.protocol import (
    chat_answer,
    models_answer,
    responses_answer,
    responses_messages,
)
from rayrollout.deployments.scripted.strategy import requested_sleep

__all__ = ["ScriptedPolicyServer", "start_scripted_server", "stop_scripted_server"]

Handler = Any


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


class ScriptedPolicyServer:
    """Plays ``strategy.next_action`` behind the OpenAI protocol on ``host:port``."""

    def __init__(self, host: str, port: int, latency_s: float, model: str, auth: RouteAuth):
        self.host, self.port = host, port
        self.latency_s = latency_s
        self.model = model
        self.auth = auth
        self.ids = itertools.count()
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Bind and serve; returns once the port listens."""
        app = web.Application(middlewares=[self._gate], client_max_size=64 * 2**20)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.host, self.port, backlog=1024).start()

    @web.middleware
    async def _gate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.auth.accepts(request.headers.get("Authorization")):
            sent = "Authorization" in request.headers
            why = "the bearer token is wrong" if sent else "no bearer token was sent"
            return _json({"detail": f"401 Unauthorized: {why}: send the run's token"}, 401)
        return await handler(request)

    async def _think(self, messages: list[dict[str, Any]]) -> None:
        delay = self.latency_s + requested_sleep(messages)
        if delay:
            await asyncio.sleep(delay)

    async def _models(self, request: web.Request) -> web.Response:
        return _json(models_answer(self.model))

    async def _chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        await self._think(body.get("messages") or [])
        return _json(chat_answer(body, self.model, next(self.ids)))

    async def _responses(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        await self._think(responses_messages(body))
        return _json(responses_answer(body, self.model, next(self.ids)))


_LIVE: dict[str, Any] = {}
"""The handles of the servers this process started, by name: a named actor that is not
detached ends when its last handle does, so they are held here until ``stop``."""


def start_scripted_server(
    name: str, namespace: str, host: str, port: int, latency_s: float, model: str, auth: RouteAuth
) -> None:
    """Start the server actor ``name`` on this (the driver's) node, where ``port`` was found
    free, and wait until it listens. Not detached: it ends with the driver, as its run does."""
    actor_class = ray.remote(ScriptedPolicyServer)
    server: Any = actor_class.options(
        name=name,
        namespace=namespace,
        num_cpus=0.1,
        max_concurrency=100_000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        ),
    ).remote(host, port, latency_s, model, auth)
    _LIVE[name] = server
    ray.get(server.start.remote())


def stop_scripted_server(name: str) -> None:
    """End the server ``name`` this process started (nothing if it is gone already)."""
    server = _LIVE.pop(name, None)
    if server is not None:
        ray.kill(server)
