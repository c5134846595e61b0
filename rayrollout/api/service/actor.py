"""The service actor: the HTTP rollout API's process, beside a detached engine.

Named ``service`` in the run's namespace and detached, like the engine ``rayrollout up``
starts; ``rayrollout status`` asks it for its URL, ``rayrollout down`` removes it. It finds
the engine by name, holds the batches (``core``) and serves the routes (``routes``) from
its own event loop, bound to the config's ``service.host`` (loopback unless configured).
Scheduled with the engine's placement (the CPU role), taking no CPU of its own.
"""

from __future__ import annotations

from typing import Any

import ray
from aiohttp import web
from pydantic import SecretStr

from rayrollout.api.service.core import RolloutService
from rayrollout.api.service.routes import build_app
from rayrollout.auth import RouteAuth
from rayrollout.data.config import RunConfig
from rayrollout.engine.actor import ENGINE_NAME

__all__ = ["SERVICE_NAME", "ServiceActor"]

SERVICE_NAME = "service"
_ANY_ADDRESS = ("0.0.0.0", "::", "")


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

    async def start(self) -> str:
        """Find the engine and start serving; returns the service's URL."""
        if self.url is not None:
            return self.url
        engine = ray.get_actor(ENGINE_NAME, namespace=self.config.namespace)
        self.service = RolloutService(self.config, engine)
        settings = self.config.service
        runner = web.AppRunner(
            build_app(self.service, self.auth), access_log=None, handle_signals=False
        )
        await runner.setup()
        site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
        await site.start()
        self.runner = runner
        port = runner.addresses[0][1]
        host = settings.host
        if host in _ANY_ADDRESS:
            host = ray.util.get_node_ip_address()
        if ":" in host:
            host = f"[{host}]"
        self.url = f"http://{host}:{port}"
        return self.url

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
