"""The service actor: the HTTP rollout API's process, beside a detached engine.

Named ``service`` in the run's namespace and detached, like the engine ``rayrollout up``
starts; ``rayrollout status`` asks it for its URL, ``rayrollout down`` removes it. It finds
the engine by name, holds the batches (``core``) and serves the routes (``routes``) from
its own event loop, bound to the config's ``service.host`` (loopback unless configured).
Scheduled with the engine's placement (the CPU role), taking no CPU of its own.

Ray restarts it when its process dies (``up`` creates it with ``max_restarts``): each
incarnation starts serving on its own, on the port the first one bound (kept in Ray's
key-value store under the actor's id), so clients keep their URL; batches come back from
their journals when a client re-submits them, as after any service restart. It waits for
the engine by name for a bounded time, and serves without one rather than not at all: a
call then answers 503 naming the command that brings an engine up (``engine_link``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
from aiohttp import web
from pydantic import SecretStr
from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

from rayrollout.api.service.core import RolloutService
from rayrollout.api.service.routes import build_app
from rayrollout.auth import RouteAuth
from rayrollout.data.config import RunConfig
from rayrollout.engine.engine_actor import ENGINE_NAME

__all__ = ["SERVICE_NAME", "ServiceActor"]

SERVICE_NAME = "service"
_ANY_ADDRESS = ("0.0.0.0", "::", "")
ENGINE_WAIT_S = 60.0  # how long start() looks for the engine by name (a loaded machine)
_PORT_KEY = "rayrollout-service-port:{}"  # + the actor's id: the port its incarnations bind

log = logging.getLogger("rayrollout")


# Ray's type stubs give ray.remote(...) task options only; max_concurrency is an actor's.
@ray.remote(num_cpus=0, max_concurrency=10_000)  # type: ignore[call-overload]
class ServiceActor:
    """Serves the rollout API of the namespace's engine over HTTP."""

    def __init__(self, config: RunConfig, route_token: SecretStr) -> None:
        self.config = config
        self.auth = RouteAuth.bearer(route_token.get_secret_value())
        self.service: RolloutService | None = None
        self.runner: web.AppRunner | None = None
        self.url: str | None = None
        self.starting = asyncio.Lock()
        # Serve without waiting for anyone to ask: after Ray restarted this actor nobody
        # will. The call runs once the constructor returns; `up`'s own start() waits on it.
        ray.get_runtime_context().current_actor.start.remote()

    async def start(self) -> str:
        """Find the engine and start serving; returns the service's URL."""
        async with self.starting:
            if self.url is None:
                self.url = await self._serve()
            return self.url

    async def _find_engine(self) -> Any:
        """The engine by name, looked up again for ``ENGINE_WAIT_S`` while it starts (or
        restarts); None past that (the service then finds it when a call needs it)."""
        deadline = time.monotonic() + ENGINE_WAIT_S
        while True:
            try:
                return await asyncio.to_thread(ray.get_actor, ENGINE_NAME, self.config.namespace)
            except ValueError:
                if time.monotonic() > deadline:
                    log.warning(
                        "no engine in namespace '%s' after %gs: serving without one "
                        "(503 until `rayrollout up --resume` starts one)",
                        self.config.namespace,
                        ENGINE_WAIT_S,
                    )
                    return None
                await asyncio.sleep(0.5)

    async def _serve(self) -> str:
        engine = await self._find_engine()
        self.service = RolloutService(self.config, engine)
        settings = self.config.service
        runner = web.AppRunner(
            build_app(self.service, self.auth), access_log=None, handle_signals=False
        )
        await runner.setup()
        key = _PORT_KEY.format(ray.get_runtime_context().get_actor_id()).encode()
        remembered = await asyncio.to_thread(_internal_kv_get, key)
        try:
            site = web.TCPSite(
                runner, settings.host, int(remembered or settings.port), backlog=1024
            )
            await site.start()
        except OSError:
            if not remembered:
                await runner.cleanup()
                raise
            log.warning("the service's earlier port %s is taken: binding another", remembered)
            site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
            await site.start()
        self.runner = runner
        port = runner.addresses[0][1]
        await asyncio.to_thread(_internal_kv_put, key, str(port).encode(), True)
        host = settings.host
        if host in _ANY_ADDRESS:
            host = ray.util.get_node_ip_address()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    def describe(self) -> dict[str, Any]:
        """The URL and what the service holds, for ``rayrollout status``."""
        service = self.service
        return {
            "url": self.url,
            "host": self.config.service.host,
            "open_batches": 0 if service is None else service.registry.open_count(),
            "limits": None if service is None else service.limits.model_dump(),
        }

    async def close(self) -> None:
        """Stop serving (``rayrollout down``); running episodes are the engine's."""
        if self.service is not None:
            await self.service.close()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
