"""``InlineChannel``: an OpenEnv environment class made in this process, no server needed.

It does for one instance what OpenEnv's server does for one WebSocket session
(``openenv.core.env_server.http_server``), with OpenEnv's own functions where it has them:
the instance made by calling the class, its MCP session (``mcp_session``) held open for the
episode, actions parsed with ``deserialize_action`` and answers made with
``serialize_observation``, ``reset_async`` / ``step_async`` awaited where the class
overrides them and the synchronous ``reset`` / ``step`` run otherwise on a thread of the
episode's own (one thread per instance, or one per process for a class that sets
``REQUIRES_SINGLE_THREAD_EXECUTOR``), so the worker's event loop keeps playing its other
episodes. ``close`` closes the MCP session and the instance.

The action class is the one the caller names, else the first type argument of the class's
``Environment[Action, Observation, State]`` base, else (an ``MCPEnvironment``) OpenEnv's
``CallToolAction``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any, get_args

from pydantic import ValidationError

from rayrollout.envkit.openenv.channel import ActionRejected, OpenEnvError, Payload

__all__ = ["InlineChannel", "import_target"]

_SHARED: ThreadPoolExecutor | None = None  # REQUIRES_SINGLE_THREAD_EXECUTOR classes' thread
_SHARED_LOCK = threading.Lock()


def import_target(path: str, what: str) -> Any:
    """``module:Name`` imported; an ``OpenEnvError`` naming ``what`` when it is not there."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise OpenEnvError(f"{what} must be 'module:Name', got {path!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise OpenEnvError(
            f"{what} {path!r} cannot be imported: {type(exc).__name__}: {exc}"
        ) from None


class InlineChannel:
    """One instance of an OpenEnv environment class, in this process, for one episode."""

    def __init__(self, env_class: str, action_class: str | None = None) -> None:
        """
        Args:
            env_class: 'module:Class' of the environment (a subclass of OpenEnv's
                ``Environment``), made with no arguments as OpenEnv's server makes it.
            action_class: 'module:Class' of its action; found from the class when None.
        """
        self.env_class = env_class
        self.action_class = action_class
        self.where = f"OpenEnv environment {env_class}"
        self.env: Any = None
        self.action_cls: Any = None
        self.executor: ThreadPoolExecutor | None = None
        self.stack = AsyncExitStack()

    async def open(self) -> dict[str, Any]:
        from openenv.core.env_server.interfaces import Environment

        cls = import_target(self.env_class, "env_class")
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise OpenEnvError(f"{self.where} is not a subclass of OpenEnv's Environment")
        self.action_cls = self._action_class(cls)
        self.executor = _executor(cls)
        try:
            self.env = await self._run(cls)
            session = getattr(self.env, "mcp_session", None)
            if callable(session):
                await self.stack.enter_async_context(session())
        except Exception as exc:
            raise OpenEnvError(
                f"{self.where} could not be made: {type(exc).__name__}: {exc}"
            ) from exc
        return dict(self.action_cls.model_json_schema())

    def _action_class(self, cls: type) -> Any:
        from openenv.core.env_server.mcp_environment import MCPEnvironment
        from openenv.core.env_server.mcp_types import CallToolAction
        from openenv.core.env_server.types import Action

        if self.action_class is not None:
            found = import_target(self.action_class, "action_class")
            if not (isinstance(found, type) and issubclass(found, Action)):
                raise OpenEnvError(f"action_class {self.action_class!r} is not an OpenEnv Action")
            return found
        for base in inspect.getmro(cls):
            for generic in getattr(base, "__orig_bases__", ()):
                args = [a for a in get_args(generic) if isinstance(a, type)]
                if args and issubclass(args[0], Action) and args[0] is not Action:
                    return args[0]
        if issubclass(cls, MCPEnvironment):
            return CallToolAction
        raise OpenEnvError(
            f"{self.where}: its action class cannot be told from the class; name it "
            "(environments.NAME.args.action_class: 'module:Class')"
        )

    async def reset(self, data: dict[str, Any]) -> Payload:
        from openenv.core.env_server.interfaces import Environment

        custom = _overrides(self.env.reset_async, Environment.reset_async)
        method = self.env.reset_async if custom else self.env.reset
        kwargs = _accepted(method, data)
        try:
            if custom:
                observation = await method(**kwargs)
            else:
                observation = await self._run(lambda: method(**kwargs))
        except Exception as exc:
            raise OpenEnvError(
                f"{self.where} failed in reset: {type(exc).__name__}: {exc}"
            ) from exc
        return self._payload(observation, "reset")

    async def step(self, action: dict[str, Any]) -> Payload:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.serialization import deserialize_action

        try:
            parsed = deserialize_action(action, self.action_cls)
        except ValidationError as exc:
            raise ActionRejected(
                "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'action'}: {e['msg']}"
                    for e in exc.errors()[:5]
                )
            ) from None
        try:
            if _overrides(self.env.step_async, Environment.step_async):
                observation = await self.env.step_async(parsed)
            else:
                observation = await self._run(lambda: self.env.step(parsed))
        except Exception as exc:
            raise OpenEnvError(f"{self.where} failed in step: {type(exc).__name__}: {exc}") from exc
        return self._payload(observation, "step")

    def _payload(self, observation: Any, what: str) -> Payload:
        from openenv.core.env_server.serialization import serialize_observation
        from openenv.core.env_server.types import WSObservationResponse

        reward = getattr(observation, "reward", None)
        if isinstance(reward, float) and not math.isfinite(reward):
            # On the wire it would turn null (pydantic writes NaN as null), a silent 0.
            raise OpenEnvError(f"{self.where} answered {what} with the reward {reward}")
        try:
            # As the server's answer goes on the wire: JSON values (an enum as its value).
            frame = WSObservationResponse(data=serialize_observation(observation))
            return Payload.model_validate(frame.model_dump(mode="json")["data"])
        except (ValidationError, AttributeError, TypeError) as exc:
            raise OpenEnvError(
                f"{self.where} answered {what} with no usable observation: "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            ) from None

    async def _run(self, call: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    async def close(self) -> None:
        try:
            await self.stack.aclose()
            if self.env is not None:
                await self._run(self.env.close)
        except Exception as exc:
            raise OpenEnvError(
                f"{self.where} failed to close: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self.env = None
            if self.executor is not None and self.executor is not _SHARED:
                self.executor.shutdown(wait=False)
            self.executor = None


def _executor(cls: type) -> ThreadPoolExecutor:
    """A thread of the instance's own, or the process's one thread where the class asks."""
    global _SHARED
    if not getattr(cls, "REQUIRES_SINGLE_THREAD_EXECUTOR", False):
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv")
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv-shared")
        return _SHARED


def _overrides(method: Any, base: Any) -> bool:
    return getattr(method, "__func__", method) is not base


def _accepted(method: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The reset arguments ``method`` takes (all of them where it takes ``**kwargs``), as
    OpenEnv's server filters them."""
    parameters = inspect.signature(method).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(data)
    names = {p.name for p in parameters}
    return {k: v for k, v in data.items() if k in names}
