"""Environment deployment: the engine puts a Serve-hosted environment up the first time a
task needs it (or when ``rayrollout up`` names it), once per environment.

The engine deploys, not the driver, because the environments are known only while tasks
stream, and training loops calling the engine take the same path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from rayrollout.auth import RouteAuth
from rayrollout.data.config import RunConfig
from rayrollout.envkit.registry import EnvironmentSpec, environment_spec
from rayrollout.envkit.sessions import resolve_hosting

__all__ = ["EnvironmentDeployer"]


class EnvironmentDeployer:
    """Deploys each environment a run needs once; ``ready`` holds those already settled."""

    def __init__(self, config: RunConfig, auth: RouteAuth) -> None:
        self.config = config
        self.auth = auth  # what the environments' HTTP routes take (the run's token)
        self.ready: set[str] = set()
        self._lock = asyncio.Lock()  # two batches naming a new environment deploy it once

    def missing(self, names: Iterable[str]) -> set[str]:
        """Those of ``names`` not settled yet (cheap: no lock, no await)."""
        return set(names) - self.ready

    def to_deploy(self, names: Iterable[str]) -> set[str]:
        """Those of ``names`` still to be put up on Serve. The others (inline, by URL, or
        unknown) are settled here at once, with a look at their class and config only, so
        that their episodes need not wait for another environment's replicas to start."""
        serve_hosted = set()
        for name in self.missing(names):
            if self._serve_hosted(name) is None:
                self.ready.add(name)
            else:
                serve_hosted.add(name)
        return serve_hosted

    async def ensure_all(self, names: Iterable[str]) -> None:
        """Settle every environment of ``names``, one after another."""
        for name in names:
            await self.ensure(name)

    async def ensure(self, name: str) -> None:
        """Deploy a Serve-hosted environment the first time a task needs it."""
        async with self._lock:
            if name in self.ready:
                return
            spec = self._serve_hosted(name)
            if spec is not None:
                settings = self.config.environment_config(name)
                # Imported here: Serve and the server module are 0.6 s of the engine's start,
                # and a run with only inline or URL environments never needs them.
                from ray import serve

                from rayrollout.engine.startup import ensure_serve
                from rayrollout.envkit.server import (
                    environment_app,
                    environment_app_name,
                    environment_deployment_options,
                    environment_route,
                )

                app = environment_app(
                    spec,
                    num_replicas=settings.replicas,
                    num_cpus=settings.num_cpus,
                    options=environment_deployment_options(self.config, name),
                    session_idle_timeout_s=settings.session_idle_timeout_s,
                    auth=self.auth,
                )
                app_name = environment_app_name(self.config.namespace, name)
                # The route serves NeMo Gym's HTTP protocol (environment/nemo_gym/routes.py).
                route = environment_route(self.config.namespace, name)
                # Serve starts with the run's HTTP options (port, host) at the first
                # Serve-hosted part, here when the policy is external: serve.run alone would
                # start it on Ray's defaults. A run without one starts no Serve at all.
                await asyncio.to_thread(ensure_serve, self.config)
                await asyncio.to_thread(serve.run, app, name=app_name, route_prefix=route)
            self.ready.add(name)

    def _serve_hosted(self, name: str) -> EnvironmentSpec | None:
        """The spec of ``name`` if it is hosted on Serve; None if it needs nothing deployed,
        or if it cannot be loaded (its episodes end as errors naming the problem)."""
        settings = self.config.environment_config(name)
        try:  # the registered name's class and config args (registry.environment_spec)
            spec = environment_spec(name, settings)
            env_cls = spec.load()
        except (LookupError, TypeError):
            return None
        return spec if resolve_hosting(settings, env_cls) == "serve" else None
