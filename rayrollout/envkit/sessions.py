"""Sessions: one episode's connection to its environment, as the episode loop sees it.

``EnvSession`` is the one contract between the episode loop and wherever the environment
runs; every kind satisfies it, ``lost`` included: ``InlineSession`` (the instance lives in
the worker), ``ServeSession`` (on a Serve replica, through a deployment handle; its server
is ``server.EnvironmentServer``) and ``nemo_gym.RemoteSession`` (a NeMo Gym resources
server by URL). ``resolve_hosting`` says which one a run's config picks.

Hops matter (a Serve handle call costs about 1 ms of caller CPU here): a stateless
environment on Serve sends the task along with each tool call and verify, and the worker
coalesces the calls its episodes make at the same moment into one handle call
(``serve_batching``). A stateful one pins every call of the episode to one replica through
Serve's consistent-hash router keyed by the episode id, and spends no hop of its own on the
session: the episode's first call opens it (``open_first``) and verify releases it
(``close_after``), so a one-tool episode is two handle calls, not four.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from ray.exceptions import RayActorError

from rayrollout.data.config import EnvironmentConfig
from rayrollout.data.schema import Task
from rayrollout.envkit.contract import Environment, Episode, ToolResult, Verification
from rayrollout.envkit.errors import EnvironmentLost, EnvironmentSetupFailed
from rayrollout.envkit.serve_batching import BatchingHandle, raised_on_replica
from rayrollout.envkit.session_store import SessionNotOpen

if TYPE_CHECKING:  # Serve costs a worker 0.6 s of imports at start; inline runs never use it
    from ray.serve.handle import DeploymentHandle

__all__ = [
    "EnvSession",
    "EnvironmentLost",
    "EnvironmentSetupFailed",
    "HostingMode",
    "InlineSession",
    "ServeSession",
    "resolve_hosting",
]

HostingMode = Literal["inline", "serve", "remote"]


@runtime_checkable
class EnvSession(Protocol):
    """One episode's connection to its environment.

    ``lost`` turns true when the environment's state went away under the episode (its
    replica died); the worker then plays the episode again from the start.
    """

    lost: bool

    async def setup(self) -> None: ...
    async def call_tool(self, name: str, arguments: str) -> ToolResult: ...
    async def verify(self, episode: Episode) -> Verification: ...
    async def close(self) -> None: ...


def resolve_hosting(settings: EnvironmentConfig, env_cls: type[Environment]) -> HostingMode:
    """Where an environment runs: 'remote' for a URL, the config's choice, else the class's
    default. ``settings`` are the config's under the environment's registered name."""
    if settings.url is not None:
        return "remote"
    return settings.hosting or env_cls.default_hosting


class InlineSession:
    """The environment instance lives in the worker's process: plain method calls."""

    def __init__(
        self, env_cls: type[Environment], task: Task, args: dict[str, Any] | None = None
    ) -> None:
        self.env = env_cls(task, **(args or {}))
        self.lost = False  # the instance lives as long as the episode: never lost

    async def setup(self) -> None:
        await self.env.setup()

    async def call_tool(self, name: str, arguments: str) -> ToolResult:
        return await self.env.call_tool(name, arguments)

    async def verify(self, episode: Episode) -> Verification:
        return await self.env.verify(episode)

    async def close(self) -> None:
        await self.env.close()


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
        self.batcher = None if stateful else batcher  # shared by the worker's episodes
        self.lost = False  # the replica died or restarted mid-episode: the worker re-runs it
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
