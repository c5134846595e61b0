"""The gateway front: one fixed loopback port in front of every episode's recording gateway.

Why it exists: a NeMo Gym model server (``openai_model``) is configured with one static
``openai_base_url``, but each rayrollout episode has its own gateway endpoint (its own URL
and key, in whichever worker actor plays it). The front listens at the fixed URL the model
server's config names (``http://127.0.0.1:PORT/v1``), reads which episode a request belongs
to from the request body's ``metadata`` (``rayrollout_gateway``, ``rayrollout_key``: the
``nemo_gym`` agent puts them in each ``/run`` body's ``responses_create_params``, and NeMo
Gym's agents and model server pass that object through), removes them and forwards the
request to that episode's gateway, answering with the gateway's answer.

It keeps no state, so any worker actor may host it: the first to bind the port does, the
others find the port bound, check that the front answers there (``GET
/rayrollout-front-health``) and rely on it; if its host actor dies, the next episode of
another actor binds the port again (``FrontKeeper``). A port held by some other program is
refused by name, never silently used.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp import web

from rayrollout.agentkit.errors import FrontPortTaken
from rayrollout.agentkit.gateway import MAX_BODY

__all__ = [
    "FRONT_HEALTH_PATH",
    "GATEWAY_FIELD",
    "KEY_FIELD",
    "FrontPortTaken",
    "FrontKeeper",
    "GatewayFront",
    "front_metadata",
    "is_front",
]

LOOPBACK = "127.0.0.1"
GATEWAY_FIELD = "rayrollout_gateway"
"""``metadata`` key holding the episode's gateway base URL (``.../e/<token>/v1``)."""
KEY_FIELD = "rayrollout_key"
"""``metadata`` key holding the episode's gateway key (sent on as ``Authorization: Bearer``)."""
FRONT_HEALTH_PATH = "/rayrollout-front-health"
SERVICE = "rayrollout-gateway-front"
PROTOCOL = 1  # bumped if the metadata keys or the forwarding change
ROUTES = ("responses", "chat/completions")
_RELY_S = 1.0  # a front found in another process is probed again after this long
_PROBE_TIMEOUT_S = 5.0


def front_metadata(gateway_url: str, api_key: str) -> dict[str, str]:
    """The ``metadata`` entries that route a request through the front to one episode."""
    return {GATEWAY_FIELD: gateway_url, KEY_FIELD: api_key}


def _error(status: int, message: str, code: str) -> web.Response:
    """An OpenAI-style error answer (what NeMo Gym's clients print when they fail)."""
    body = {"error": {"message": message, "type": "rayrollout_gateway_front", "code": code}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _gateway_url_problem(url: str) -> str:
    """Why ``url`` is not a gateway the front forwards to ("" when it is one).

    The front listens on loopback, where any local program can reach it; forwarding only to
    loopback ``.../v1`` endpoints keeps it from relaying requests to other hosts.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        _ = parts.port  # a malformed port raises here
    except ValueError as exc:
        return f"it is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "it is not an http(s) URL"
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return f"its host {host!r} is not a loopback address"
    if not parts.path.rstrip("/").endswith("/v1"):
        return "its path does not end in /v1 (an episode gateway's base URL)"
    return ""


class GatewayFront:
    """The front's HTTP server on ``host:port`` (started in the calling event loop)."""

    def __init__(self, port: int, host: str = LOOPBACK) -> None:
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        """The base URL a NeMo Gym model server names as its ``openai_base_url``."""
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        """Bind and serve; raises ``OSError`` (``EADDRINUSE``) when the port is taken."""
        app = web.Application(client_max_size=MAX_BODY)  # what the gateways behind it take
        app.router.add_get(FRONT_HEALTH_PATH, self._health)
        for route in ROUTES:
            app.router.add_post(f"/v1/{route}", self._forwarder(route))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            # reuse_port stays off: a second binder must fail, not share the port.
            await web.TCPSite(runner, self.host, self.port, reuse_port=False).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            # No total limit: a model call takes as long as the policy needs, and the
            # gateway and NeMo Gym's own client keep their own timeouts.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,  # the answer goes back byte for byte, encoding included
        )

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"service": SERVICE, "protocol": PROTOCOL})

    def _forwarder(self, route: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._forward(request, route)

        return handle

    async def _forward(self, request: web.Request, route: str) -> web.StreamResponse:
        """Send one request on to the episode its metadata names; answer with its answer."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, f"the body of POST /v1/{route} is not JSON", "invalid_body")
        if not isinstance(body, dict):
            return _error(400, f"the body of POST /v1/{route} is not a JSON object", "invalid_body")
        metadata = body.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        gateway, key = metadata.get(GATEWAY_FIELD), metadata.get(KEY_FIELD)
        if not (isinstance(gateway, str) and gateway and isinstance(key, str) and key):
            return _error(
                400,
                f"rayrollout's gateway front forwards only requests of rayrollout episodes: "
                f"this request's metadata has no {GATEWAY_FIELD!r} and {KEY_FIELD!r}. "
                "rayrollout's nemo_gym agent sets them in responses_create_params.metadata of "
                "each /run; the NeMo Gym agent must pass responses_create_params (metadata "
                "included) through to its model server, as simple_agent does",
                "missing_episode_metadata",
            )
        problem = _gateway_url_problem(gateway)
        if problem:
            return _error(
                400,
                f"metadata {GATEWAY_FIELD}={gateway!r} is not an episode gateway: {problem}",
                "invalid_episode_gateway",
            )
        rest = {k: v for k, v in metadata.items() if k not in (GATEWAY_FIELD, KEY_FIELD)}
        if rest:
            body["metadata"] = rest
        else:
            body.pop("metadata", None)
        url = f"{gateway.rstrip('/')}/{route}"
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        assert self._http is not None, "the front is not started"
        try:
            upstream = await self._http.post(url, data=orjson.dumps(body), headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return _error(
                502,
                f"the episode's gateway at {gateway} did not answer ({reason}); its episode "
                "may have ended or its worker actor stopped",
                "episode_gateway_unreachable",
            )
        async with upstream:
            if upstream.status in (401, 403):
                # NeMo Gym's model client stops calling its endpoint for good after a 401/403
                # that reads like a bad key; here that endpoint is the front, shared by every
                # episode, so one ended episode's refusal must not stop the others.
                text = (await upstream.read()).decode(errors="replace")[:500]
                return _error(
                    410,
                    f"the episode's gateway at {gateway} refused its key (HTTP "
                    f"{upstream.status}: {text}); the episode has ended or the key is wrong",
                    "episode_gone",
                )
            answer = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name in ("Content-Type", "Content-Encoding"):
                if name in upstream.headers:
                    answer.headers[name] = upstream.headers[name]
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():  # streamed answers stay streamed
                await answer.write(chunk)
            await answer.write_eof()
            return answer


async def is_front(host: str, port: int, timeout_s: float = _PROBE_TIMEOUT_S) -> bool:
    """Whether rayrollout's gateway front answers at ``host:port``."""
    url = f"http://{host}:{port}{FRONT_HEALTH_PATH}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
            async with http.get(url) as response:
                if response.status != 200:
                    return False
                answer = orjson.loads(await response.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return False
    return isinstance(answer, dict) and answer.get("service") == SERVICE


class FrontKeeper:
    """Makes sure a front serves ``host:port``: hosted here, or found hosted elsewhere.

    One per agent instance; ``ensure`` is called before each episode, so a front whose host
    actor died is bound again by the next episode that needs it.
    """

    def __init__(self, port: int, host: str = LOOPBACK) -> None:
        self.host = host
        self.port = port
        self.front: GatewayFront | None = None  # the front, when this process hosts it
        self._relied_at = -_RELY_S
        self._lock: asyncio.Lock | None = None

    async def ensure(self) -> None:
        """Host the front, or check that another process does. Raises ``FrontPortTaken``
        when another program holds the port, ``OSError`` when it cannot be bound at all."""
        if self.front is not None or time.monotonic() - self._relied_at < _RELY_S:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.front is not None or time.monotonic() - self._relied_at < _RELY_S:
                return
            front = GatewayFront(self.port, self.host)
            try:
                await front.start()
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
            else:
                self.front = front
                return
            if not await is_front(self.host, self.port):
                raise FrontPortTaken(
                    f"port {self.port} on {self.host} is in use by a program that is not "
                    f"rayrollout's gateway front (it does not answer GET {FRONT_HEALTH_PATH} "
                    "as the front): give the nemo_gym agent's gateway_port and the NeMo Gym "
                    "model server's openai_base_url a free port"
                )
            self._relied_at = time.monotonic()

    async def close(self) -> None:
        """Stop the front if this process hosts it."""
        if self.front is not None:
            await self.front.close()
            self.front = None
