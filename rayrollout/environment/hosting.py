"""Where an environment runs: inline in the agent, or on Ray Serve replicas.

Both modes give the agent the same ``EnvSession`` (setup, call_tool, verify, close), so an
environment behaves the same wherever the config puts it. (``nemo_gym.RemoteSession`` is the
third kind: an environment on a NeMo Gym resources server.)

The Serve app also answers NeMo Gym's resources-server protocol over HTTP (``POST
/seed_session``, ``/<tool>``, ``/verify``, ``/close_session``), so a NeMo Gym agent or any
HTTP client can use a rayrollout environment. An HTTP episode is keyed by a session cookie
(or an ``x-session-id`` header); the replica that takes the request forwards it through a
handle with that key as ``session_id``, so with several replicas every call of one HTTP
episode still reaches the replica holding its state.

Hops matter (a Serve handle call costs about 1 ms of caller CPU here): a stateless
environment on Serve sends the task along with each tool call and verify, and the agent
coalesces the calls its episodes make at the same moment into one handle call
(``serve_batching``). A stateful one pins every call of the episode to one replica through
Serve's consistent-hash router keyed by the episode id, and spends no hop of its own on the
session: the episode's first call opens it (``open_first``) and verify releases it
(``close_after``), so a one-tool episode is two handle calls, not four.
"""

from __future__ import annotations

from typing import Any, Protocol

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from rayrollout.data.config import DEFAULT_SESSION_IDLE_TIMEOUT_S, RunConfig
from rayrollout.data.schema import Task
from rayrollout.engine.placement import cpu_actor_options
from rayrollout.environment import Environment, Episode, ToolResult, Verification
from rayrollout.environment.nemo_gym.routes import NemoGymRoutes, http_app
from rayrollout.environment.registry import load_environment
from rayrollout.environment.serve_batching import BatchingHandle, raised_on_replica, run_batch
from rayrollout.environment.session_store import SessionNotOpen, SessionStore

__all__ = [
    "EnvSession",
    "EnvironmentLost",
    "EnvironmentSetupFailed",
    "EnvironmentServer",
    "InlineSession",
    "ServeSession",
    "environment_app",
    "environment_app_name",
    "environment_deployment_options",
    "environment_route",
]

_ROUTER = "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter"


class EnvironmentLost(RuntimeError):
    """The episode's replica died or restarted mid-episode; its state is gone (retry it)."""


class EnvSession(Protocol):
    """One episode's connection to its environment."""

    async def setup(self) -> None: ...
    async def call_tool(self, name: str, arguments: str) -> ToolResult: ...
    async def verify(self, episode: Episode) -> Verification: ...
    async def close(self) -> None: ...


class InlineSession:
    """The environment instance lives in the agent's process: plain method calls."""

    def __init__(self, env_cls: type[Environment], task: Task) -> None:
        self.env = env_cls(task)

    async def setup(self) -> None:
        await self.env.setup()

    async def call_tool(self, name: str, arguments: str) -> ToolResult:
        return await self.env.call_tool(name, arguments)

    async def verify(self, episode: Episode) -> Verification:
        return await self.env.verify(episode)

    async def close(self) -> None:
        await self.env.close()


class EnvironmentSetupFailed(RuntimeError):
    """The environment's ``setup`` raised on its replica (opening a stateful session)."""


class ServeSession:
    """The environment instance lives on a Serve replica, reached by a deployment handle."""

    def __init__(
        self,
        handle: DeploymentHandle,
        stateful: bool,
        episode_id: str,
        task: Task,
        batcher: BatchingHandle | None = None,
    ) -> None:
        self.stateful = stateful
        self.episode_id = episode_id
        self.task = task
        self.handle = handle.options(session_id=episode_id) if stateful else handle
        self.batcher = None if stateful else batcher  # shared by the agent's episodes
        self.lost = False  # the replica died or restarted mid-episode: the agent re-runs it
        # Stateful: the replica opens the session with the episode's first call and closes
        # it with verify, two handle calls fewer per episode than open + ... + close.
        self.open_sent = False
        self.closed = False

    def _lost(self, during: str, exc: BaseException) -> EnvironmentLost:
        self.lost = True
        return EnvironmentLost(
            f"environment session lost during {during} (its replica died or restarted, or it "
            f"expired idle, so the episode's state is gone): {type(exc).__name__}: "
            f"{str(exc)[:300]}"
        )

    async def setup(self) -> None:
        """Nothing to do here: a stateful session opens with the episode's first call."""

    def _opening(self) -> bool:
        """Whether the next call must open the session (sent once, before it is awaited, so
        a call cancelled by a timeout still leaves ``close`` to release what it opened)."""
        opening = not self.open_sent
        self.open_sent = True
        return opening

    async def call_tool(self, name: str, arguments: str) -> ToolResult:
        try:
            if self.stateful:
                opening = self._opening()  # the task travels only with the opening call
                return await self.handle.call_tool.remote(
                    self.episode_id, self.task if opening else None, name, arguments, opening
                )
            if self.batcher is not None:
                return await self.batcher.call("call_tool", None, self.task, name, arguments)
            return await self.handle.call_tool.remote(None, self.task, name, arguments)
        except EnvironmentSetupFailed as exc:
            raise EnvironmentSetupFailed(str(raised_on_replica(exc))) from None
        except (RayActorError, SessionNotOpen) as exc:
            raise self._lost(f"tool '{name}'", exc) from exc

    async def verify(self, episode: Episode) -> Verification:
        try:
            if self.stateful:
                self.closed = True  # the replica releases the session whatever verify does
                return await self.handle.verify.remote(
                    self.episode_id, episode, self._opening(), True
                )
            if self.batcher is not None:
                return await self.batcher.call("verify", None, episode)
            return await self.handle.verify.remote(None, episode)
        except EnvironmentSetupFailed as exc:
            raise EnvironmentSetupFailed(str(raised_on_replica(exc))) from None
        except (RayActorError, SessionNotOpen) as exc:
            raise self._lost("verify", exc) from exc

    async def close(self) -> None:
        if self.stateful and self.open_sent and not self.closed:
            self.closed = True
            await self.handle.close.remote(self.episode_id)


@serve.deployment(
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=1000,
    logging_config={"log_level": "WARNING", "enable_access_log": False},
    request_router_config=RequestRouterConfig(
        request_router_class=_ROUTER, request_router_kwargs={"num_fallback_replicas": 0}
    ),
)
@serve.ingress(http_app)
class EnvironmentServer(NemoGymRoutes):
    """A Serve replica hosting one environment class; stateful episodes keyed by episode id."""

    def __init__(
        self,
        env_path: str,
        session_idle_timeout_s: float = DEFAULT_SESSION_IDLE_TIMEOUT_S,
        single_replica: bool = False,
    ) -> None:
        self.env_cls = load_environment(env_path)
        self.sessions = SessionStore(self.env_cls.name, session_idle_timeout_s)
        self.self_handle: DeploymentHandle | None = None
        # With one replica every session lives here: HTTP calls need no routing hop.
        self.route_locally = single_replica

    async def open(self, episode_id: str, task: Task) -> None:
        await self.close(episode_id)  # a re-seeded HTTP session starts over
        env = self.env_cls(task)
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
        if episode_id is None:
            assert task is not None
            return await self.env_cls(task).call_tool(name, arguments)
        if open_first:
            assert task is not None
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
            return await self.env_cls(episode.task).verify(episode)
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
    options: dict[str, Any] = {"ray_actor_options": cpu_actor_options(config, {})}
    if settings.autoscaling is not None:
        options["autoscaling_config"] = settings.autoscaling.serve_config()
        options["max_ongoing_requests"] = settings.autoscaling.max_ongoing_requests
    return options


def environment_app(
    env_path: str,
    num_replicas: int = 1,
    num_cpus: float = 0.1,
    options: dict[str, Any] | None = None,
    session_idle_timeout_s: float = DEFAULT_SESSION_IDLE_TIMEOUT_S,
) -> serve.Application:
    """A Serve application hosting the environment at ``env_path`` on ``num_replicas`` replicas;
    a stateful session with no call for ``session_idle_timeout_s`` is closed."""
    options = dict(options or {})
    single_replica = (
        "autoscaling_config" not in options and options.get("num_replicas", num_replicas) == 1
    )
    actor_options = {"num_cpus": num_cpus, **options.pop("ray_actor_options", {})}
    if "autoscaling_config" in options:
        options["num_replicas"] = "auto"
    deployment = EnvironmentServer.options(
        num_replicas=options.pop("num_replicas", num_replicas),
        ray_actor_options=actor_options,
        **options,
    )
    return deployment.bind(env_path, session_idle_timeout_s, single_replica)
