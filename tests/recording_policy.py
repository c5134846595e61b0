"""The scripted policy's own server (``actor_server``), run in the test's process and
keeping every request body it was sent: what a test inspects to see what the policy got."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from netutil import free_port

from rayrollout.auth import RouteAuth
from rayrollout.data.images import decode_data_url
from rayrollout.deployments.scripted.actor_server import ScriptedPolicyServer

TOKEN = "secret"


class RecordingScriptedPolicy(ScriptedPolicyServer):
    """The scripted policy's own server, keeping each request body it was sent."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", free_port(), 0.0, "scripted", RouteAuth.bearer(TOKEN))
        self.bodies: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return await super()._chat(request)

    async def _responses(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return await super()._responses(request)


@asynccontextmanager
async def recording_scripted_policy() -> AsyncIterator[RecordingScriptedPolicy]:
    """A started ``RecordingScriptedPolicy`` on a free port of 127.0.0.1, cleaned up after."""
    server = RecordingScriptedPolicy()
    await server.start()
    try:
        yield server
    finally:
        assert server.runner is not None
        await server.runner.cleanup()


def body_images(value: Any) -> list[bytes]:
    """The bytes of every data URL anywhere in a request body, in order."""
    if isinstance(value, dict):
        return [b for v in value.values() for b in body_images(v)]
    if isinstance(value, list):
        return [b for v in value for b in body_images(v)]
    if isinstance(value, str) and value.startswith("data:"):
        return [decode_data_url(value)[1]]
    return []
