"""NeMo Gym's entrypoint for rayrollout's rollout service as an agent server.

NeMo Gym reaches an agent server by the ``host:port`` of its config block, and ``ng_run``
starts every block's ``app.py``; 0.7.0 has no block for a server it did not start. This
entrypoint is that block's server: it listens on the block's host and port and relays
``POST /run`` and ``POST /aggregate_metrics`` to the rollout service at ``url`` (started by
``rayrollout up``), with the service's bearer token when ``token_file`` is set. So
``ng_collect_rollouts`` (through its ``legacy_agent`` environment server) and anything else
that drives a NeMo Gym agent server has rayrollout's agents, environments and policy play
its rows. It runs on NeMo Gym's interpreter and needs only what nemo-gym installs
(aiohttp, pyyaml).

The block (see docs/how-to/nemo-gym.md), under ``responses_api_agents: rayrollout_service:``::

    entrypoint: app.py
    url: http://127.0.0.1:8321                          # `rayrollout status` prints it
    token_file: ~/.rayrollout/route-tokens/rayrollout   # optional; the service's token
    host: 127.0.0.1                                     # where NeMo Gym reaches this relay
    port: 8124                                          # optional: ng_run picks one

The relay adds nothing and drops nothing: the service's answer (the verify response, or
500 with NeMo Gym's failure fields for an episode that failed) goes back as it came. A
service that cannot be reached answers 502 naming its URL.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

_AGENT_KEY = "rayrollout_service"
_ROUTES = ("run", "aggregate_metrics")
# An episode takes as long as it takes: only the connection has a limit.
_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30)


def _block() -> dict:
    config = yaml.safe_load(os.environ.get("NEMO_GYM_CONFIG_DICT", "") or "{}")
    name = os.environ.get("NEMO_GYM_CONFIG_PATH", "")
    try:
        return config[name]["responses_api_agents"][_AGENT_KEY]
    except (KeyError, TypeError):
        sys.exit(
            f"{_AGENT_KEY}: no 'responses_api_agents: {_AGENT_KEY}:' block under '{name}' in "
            "NeMo Gym's config; start this entrypoint through ng_run with such a block"
        )


def _token_headers(token_file: str | None) -> dict[str, str]:
    if not token_file:
        return {}
    path = Path(token_file).expanduser()
    try:
        token = path.read_text().strip()
    except OSError as exc:
        sys.exit(f"{_AGENT_KEY}: cannot read token_file {path}: {exc.strerror}")
    if not token:
        sys.exit(f"{_AGENT_KEY}: token_file {path} is empty")
    return {"Authorization": f"Bearer {token}"}


def make_app(url: str, headers: dict[str, str]) -> web.Application:
    """The relay: POST /run and /aggregate_metrics to ``url``; GET / says where it relays."""
    base = url.rstrip("/")

    async def start(app: web.Application) -> None:
        app["client"] = aiohttp.ClientSession(timeout=_TIMEOUT, headers=headers)

    async def stop(app: web.Application) -> None:
        await app["client"].close()

    async def describe(request: web.Request) -> web.Response:
        return web.json_response({"agent": _AGENT_KEY, "relays_to": base, "routes": _ROUTES})

    async def relay(request: web.Request) -> web.Response:
        route = request.match_info["route"]
        if route not in _ROUTES:
            return web.json_response(
                {"detail": f"{_AGENT_KEY} relays only {', '.join(f'POST /{r}' for r in _ROUTES)}"},
                status=404,
            )
        body = await request.read()
        kind = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        try:
            async with request.app["client"].post(
                f"{base}/{route}", data=body, headers=kind
            ) as answer:
                content = await answer.read()
                media = {"Content-Type": answer.headers.get("Content-Type", "application/json")}
                return web.Response(body=content, status=answer.status, headers=media)
        except aiohttp.ClientError as exc:
            return web.json_response(
                {
                    "detail": f"{_AGENT_KEY}: the rollout service at {base} did not answer "
                    f"POST /{route} ({type(exc).__name__}: {exc}); check that `rayrollout up` "
                    "is running and that 'url' in this block is its address"
                },
                status=502,
            )

    app = web.Application(client_max_size=1 << 30)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/", describe)
    app.router.add_post("/{route}", relay)
    return app


def main() -> None:
    block = _block()
    missing = [key for key in ("url", "host", "port") if not block.get(key)]
    if missing:
        sys.exit(f"{_AGENT_KEY}: the config block needs {', '.join(missing)}")
    app = make_app(str(block["url"]), _token_headers(block.get("token_file")))
    print(f"{_AGENT_KEY}: relaying /run to {block['url']}", flush=True)
    web.run_app(app, host=str(block["host"]), port=int(block["port"]), print=None)


if __name__ == "__main__":
    main()
