"""``SocketChannel``: an OpenEnv environment served by OpenEnv's own FastAPI app, by URL.

The server (``openenv.core.env_server.http_server``) keeps an episode's instance only for
the life of one WebSocket on ``/ws``: each connection makes its own instance, messages
``{"type": "reset" | "step" | "close", "data": ...}`` act on it, each answered by
``{"type": "observation", "data": payload}`` or ``{"type": "error", "data": {message,
code}}``. (Its plain ``POST /reset`` and ``/step`` make a fresh instance per request, so
state never survives between them: they cannot play an episode.) ``GET /schema`` gives the
action class's JSON schema.

A ``VALIDATION_ERROR`` answer to a step is the action not fitting the action class
(``ActionRejected``); any other error frame, a closed socket or a timeout is an
``OpenEnvError`` naming the URL and the step. ``close`` sends ``close`` and ends the socket;
the server then closes the instance.

The socket is read all the time, not only while a step waits for its answer: the server
pings it (uvicorn every 20 s) and drops a connection whose pong is late, and aiohttp answers
a ping only when the socket is read. Between steps the model may think for minutes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from pydantic import ValidationError

from rayrollout.data.json_text import json_object
from rayrollout.data.validation import problem_text
from rayrollout.envkit.openenv.channel import ActionRejected, OpenEnvError, Payload

__all__ = ["SocketChannel", "socket_url"]


def socket_url(url: str) -> str:
    """The ``/ws`` URL of a server's base URL (``http://h:p`` -> ``ws://h:p/ws``)."""
    base = url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base.removeprefix("https://")
    elif base.startswith("http://"):
        base = "ws://" + base.removeprefix("http://")
    return base if base.endswith("/ws") else base + "/ws"


class SocketChannel:
    """One WebSocket session on an OpenEnv server: one environment instance, one episode."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        """
        Args:
            url: The server's base URL ('http://127.0.0.1:8000'; ws:// and a /ws suffix too).
            timeout_s: How long one answer (connect, schema, reset, step) may take.
        """
        self.ws_url = socket_url(url)
        self.http_url = self.ws_url.removesuffix("/ws").replace("ws", "http", 1)
        self.timeout_s = timeout_s
        self.where = f"OpenEnv environment at {self.ws_url}"
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.frames: asyncio.Queue[aiohttp.WSMessage] = asyncio.Queue()
        self.reader: asyncio.Task[None] | None = None
        self.steps = 0

    async def open(self) -> dict[str, Any]:
        # No total timeout on the session: the socket lives as long as the episode.
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.http.get(f"{self.http_url}/schema") as response:
                    text = await response.text()
                    if response.status >= 400:
                        raise OpenEnvError(
                            f"{self.where} answered HTTP {response.status} to GET /schema: "
                            f"{text[:300]} (is it an OpenEnv server?)"
                        )
                schema = orjson.loads(text).get("action")
                self.ws = await self.http.ws_connect(self.ws_url, max_msg_size=0)
            self.reader = asyncio.create_task(self._read(self.ws))
        except OpenEnvError:
            raise
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, AttributeError) as exc:
            raise OpenEnvError(
                f"{self.where} could not be opened: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(schema, dict):
            raise OpenEnvError(f"{self.where}: GET /schema gave no action schema")
        return schema

    async def reset(self, data: dict[str, Any]) -> Payload:
        return await self._ask({"type": "reset", "data": data}, "reset")

    async def step(self, action: dict[str, Any]) -> Payload:
        self.steps += 1
        return await self._ask({"type": "step", "data": action}, f"step {self.steps}")

    async def _ask(self, message: dict[str, Any], what: str) -> Payload:
        if self.ws is None:
            raise OpenEnvError(f"{self.where} was not opened before {what}")
        try:
            await self.ws.send_str(orjson.dumps(message).decode())
            async with asyncio.timeout(self.timeout_s):
                frame = await self.frames.get()
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise self._lost(what, f"{type(exc).__name__}: {exc}") from None
        except TimeoutError:
            raise self._lost(what, f"no answer within {self.timeout_s}s") from None
        if frame.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            raise self._lost(what, f"the socket closed ({frame.type.name}, {frame.data})")
        answer = json_object(frame.data)
        if answer is None or not isinstance(answer.get("data"), dict):
            raise OpenEnvError(
                f"{self.where} answered {what} with no JSON object: {frame.data!r:.300}"
            )
        data = answer["data"]
        if answer.get("type") == "error":
            if data.get("code") == "VALIDATION_ERROR" and what.startswith("step"):
                self.steps -= 1  # the server stepped nothing
                raise ActionRejected(_validation_text(data.get("errors")))
            raise OpenEnvError(
                f"{self.where} failed in {what}: {data.get('code', 'error')}: "
                f"{str(data.get('message'))[:500]}"
            )
        try:
            return Payload.model_validate(data)
        except ValidationError as exc:
            raise OpenEnvError(
                f"{self.where} answered {what} with an unusable {problem_text(exc)}"
            ) from None

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Every frame into ``frames`` (pings answered on the way), the closing one last."""
        while True:
            try:
                frame = await ws.receive()
            except Exception as exc:  # as a frame, so the step waiting for one is told
                frame = aiohttp.WSMessage(aiohttp.WSMsgType.ERROR, exc, None)
            self.frames.put_nowait(frame)
            if frame.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                return

    def _lost(self, what: str, why: str) -> OpenEnvError:
        return OpenEnvError(f"{self.where}: the session was lost during {what}: {why}")

    async def close(self) -> None:
        ws, http, reader = self.ws, self.http, self.reader
        self.ws = self.http = self.reader = None
        try:
            if ws is not None and not ws.closed:
                try:
                    await ws.send_str('{"type": "close"}')
                except (aiohttp.ClientError, ConnectionError, RuntimeError):
                    pass  # the server is gone: nothing of the session is left to release
                await asyncio.wait_for(ws.close(), self.timeout_s)
        finally:
            if reader is not None:
                reader.cancel()
            if http is not None:
                await http.close()


def _validation_text(errors: Any) -> str:
    """Pydantic's errors as the server sent them, one line each: "guess: Field required"."""
    if not isinstance(errors, list) or not errors:
        return "the action does not fit the environment's action class"
    lines = []
    for error in errors[:5]:
        if isinstance(error, dict):
            where = ".".join(str(p) for p in error.get("loc") or []) or "action"
            lines.append(f"{where}: {error.get('msg')}")
    return "; ".join(lines)
