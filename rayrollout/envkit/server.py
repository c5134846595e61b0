"""The Serve side of hosting: ``EnvironmentServer`` replicas and the application around them.

A replica hosts one environment and answers ``ServeSession``'s handle calls: stateless calls
build an instance per call, stateful episodes keep theirs in a ``SessionStore`` on one
replica (consistent-hash routing). The same app speaks NeMo Gym's protocol over HTTP.
"""

from __future__ import annotations

import importlib
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from rayrollout.auth import RouteAuth
from rayrollout.data.config import DEFAULT_SESSION_IDLE_TIMEOUT_S, RunConfig
from rayrollout.data.schema import Task
from rayrollout.envkit.contract import Environment, Episode, ToolResult, Verification
from rayrollout.envkit.nemo_gym.routes import NemoGymRoutes, http_app
from rayrollout.envkit.registry import EnvironmentSpec, environment_spec
from rayrollout.envkit.serve_batching import run_batch
from rayrollout.envkit.session_store import SessionStore
from rayrollout.envkit.sessions import EnvironmentSetupFailed
from rayrollout.gc_tuning import tune_gc

__all__ = [
    "EnvironmentServer",
    "environment_app",
    "environment_app_name",
    "environment_deployment_options",
    "environment_route",
]

_ROUTER = "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter"


@serve.deployment(
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=1000,
    logging_config={"log_level": "WARNING", "enable_access_log": False},
    request_router_config=RequestRouterConfig(  # Ray's stubs miss that it takes a path string
        request_router_class=_ROUTER,  # type: ignore[arg-type]
        request_router_kwargs={"num_fallback_replicas": 0},
    ),
)
@serve.ingress(http_app)
class EnvironmentServer(NemoGymRoutes):
    """A Serve replica hosting one environment; stateful episodes keyed by episode id."""

    def __init__(
        self,
        spec: EnvironmentSpec,
        session_idle_timeout_s: float = DEFAULT_SESSION_IDLE_TIMEOUT_S,
        single_replica: bool = False,
        auth: RouteAuth | None = None,
    ) -> None:
        # HTTP callers must bear the run's token; handle calls (the engine's) never pass HTTP.
        # None (no RouteAuth given) leaves the routes refusing everyone.
        if auth is not None:
            auth.install()
        _bind_routes_here()
        self.spec = spec
        self.env_cls = spec.load()
        self.env_name = spec.name
        self.sessions = SessionStore(spec.name, session_idle_timeout_s)
        self.self_handle: DeploymentHandle | None = None
        # With one replica every session lives here: HTTP calls need no routing hop.
        self.route_locally = single_replica
        tune_gc()  # a replica churns through episodes as a worker does (gc_tuning)

    def _new(self, task: Task) -> Environment:
        """A new instance for one episode (or one stateless call), built with the spec's args."""
        return self.spec.create(task, self.env_cls)

    async def open(self, episode_id: str, task: Task) -> None:
        await self.close(episode_id)  # a re-seeded HTTP session starts over
        env = self._new(task)
        await env.setup()
        await self.sessions.open(episode_id, env)

    async def _open_first(self, episode_id: str, task: Task) -> None:
        """The open fused into an episode's first call; a failing setup says it was setup."""
        try:
            await self.open(episode_id, task)
        except Exception as exc:
            raise EnvironmentSetupFailed(f"{type(exc).__name__}: {exc}") from exc

    async def call_tool(
        self,
        episode_id: str | None,
        task: Task | None,
        name: str,
        arguments: str,
        open_first: bool = False,
    ) -> ToolResult:
        """A tool call; stateless (``episode_id`` None) builds the environment from ``task``,
        stateful runs in the episode's session, opened first when ``open_first``."""
        if episode_id is None or open_first:
            if task is None:
                raise ValueError(
                    f"call_tool '{name}' of environment '{self.env_name}' needs the task when "
                    "stateless or opening the session (ServeSession sends it)"
                )
            if episode_id is None:
                return await self._new(task).call_tool(name, arguments)
            await self._open_first(episode_id, task)
        with self.sessions.use(episode_id) as env:
            return await env.call_tool(name, arguments)

    async def verify(
        self,
        episode_id: str | None,
        episode: Episode,
        open_first: bool = False,
        close_after: bool = False,
    ) -> Verification:
        """Score an episode; a stateful session can be opened first (an episode without a
        tool call) and released after (the episode's last call), whatever verify does."""
        if episode_id is None:
            return await self._new(episode.task).verify(episode)
        try:
            if open_first:
                await self._open_first(episode_id, episode.task)
            with self.sessions.use(episode_id) as env:
                return await env.verify(episode)
        finally:
            if close_after:
                await self.close(episode_id)

    async def batch(self, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Stateless calls of many episodes in one request (``serve_batching``)."""
        return await run_batch(self, calls)

    async def close(self, episode_id: str) -> None:
        await self.sessions.close(episode_id)

    def open_sessions(self) -> int:
        """How many episodes hold state on this replica (for tests and status)."""
        return len(self.sessions)

    def expired_sessions(self) -> int:
        """How many sessions this replica closed for being idle past the timeout."""
        return self.sessions.expired_count


def _bind_routes_here() -> None:
    """Make sure this module ran in the replica's process, before its first request.

    Serve ships this class by value (the module's name holds the Deployment, not the class),
    while the route functions of ``NemoGymRoutes`` travel by reference. ``@serve.ingress``
    marks those functions' ``self`` as injected (their ``__signature__``) when this module
    is imported; that mark does not travel with a function sent by reference. A replica
    that never imported this module (nothing else of rayrollout imports it there since
    ``import rayrollout`` is lazy) then answers every route 422 "missing query 'self'".
    """
    importlib.import_module(__name__)


def environment_route(namespace: str, env_name: str) -> str:
    """HTTP route prefix of an environment's app (NeMo Gym protocol) on Serve's proxy."""
    return f"/{namespace}/env/{env_name}"


def environment_app_name(namespace: str, env_name: str) -> str:
    """Serve application name of an environment in a run's namespace."""
    return f"{namespace}.env.{env_name}"


def environment_deployment_options(config: RunConfig, env_name: str) -> dict[str, Any]:
    """Serve options of an environment's deployment from the run's config: its placement on
    CPU nodes and, when configured, autoscaling bounds with a per-replica request cap (calls
    beyond it wait in the caller: backpressure, not errors)."""
    settings = config.environment_config(env_name)
    options: dict[str, Any] = {"ray_actor_options": config.placement.cpu_options({})}
    if settings.autoscaling is not None:
        options["autoscaling_config"] = settings.autoscaling.serve_config()
        options["max_ongoing_requests"] = settings.autoscaling.max_ongoing_requests
    return options


def environment_app(
    env: EnvironmentSpec | str,
    num_replicas: int = 1,
    num_cpus: float = 0.1,
    options: dict[str, Any] | None = None,
    session_idle_timeout_s: float = DEFAULT_SESSION_IDLE_TIMEOUT_S,
    *,
    auth: RouteAuth,
) -> serve.Application:
    """A Serve application hosting environment ``env`` on ``num_replicas`` replicas; a
    stateful session with no call for ``session_idle_timeout_s`` is closed. Its HTTP routes
    take requests bearing the token ``auth`` was made from (``RouteAuth.bearer(token)``), or
    any request when the caller chose ``RouteAuth.open()``: there is no default.

    ``env`` is a spec (``registry.environment_spec``: its config ``args`` included) or a
    registered name or ``"module:Class"`` path (built without args).

    Example:
        >>> auth = RouteAuth.bearer(token)
        >>> app = environment_app("weather", num_replicas=2, auth=auth)  # doctest: +SKIP
        >>> serve.run(app, name="weather", route_prefix="/weather")  # doctest: +SKIP
    """
    spec = env if isinstance(env, EnvironmentSpec) else environment_spec(env)
    options = dict(options or {})
    single_replica = (
        "autoscaling_config" not in options and options.get("num_replicas", num_replicas) == 1
    )
    actor_options = {"num_cpus": num_cpus, **options.pop("ray_actor_options", {})}
    if "autoscaling_config" in options:
        options["num_replicas"] = "auto"
    # serve.deployment turns the class into a Deployment; its stubs still type the class.
    deployment = EnvironmentServer.options(  # type: ignore[attr-defined]
        num_replicas=options.pop("num_replicas", num_replicas),
        ray_actor_options=actor_options,
        **options,
    )
    return deployment.bind(spec, session_idle_timeout_s, single_replica, auth)
