"""``OpenEnvEnvironment``: an OpenEnv environment as a rayrollout environment ('openenv').

Either by URL (``url``: a server running OpenEnv's own FastAPI app, played over its
WebSocket session) or by class (``env_class``: the environment made in the worker, so no
server is needed). Either way one episode is one environment instance, played by the
``reset_step`` agent (``episode.OpenEnvEpisode``): opened in ``setup``, closed in ``close``
(failed episodes included); a session lost mid-episode ends the episode ``error`` naming
it. A row may carry ``seed`` and ``reset_kwargs`` (the reset's other arguments). It is the
``reset_step`` agent's by default (``default_agent``): naming the environment is enough.

Before a run (``config_problem``) the args are checked as far as can be without playing: by
URL, one ``GET /schema`` must answer with an action schema within a few seconds; by class,
``openenv`` must be installed and the class (and ``action_class``) importable here and an
OpenEnv ``Environment`` (a mistyped name is answered with the nearest names its module has).

Config (a server by URL, and a class in the workers)::

    environments:
      counter:
        path: rayrollout.envkit.openenv:OpenEnvEnvironment
        args: {url: "http://127.0.0.1:8000"}
      guess:
        path: rayrollout.envkit.openenv:OpenEnvEnvironment
        args: {env_class: "my_envs.guess:GuessEnv"}
"""

from __future__ import annotations

import importlib.util
from typing import Any

from rayrollout.data.schema import Message, Task
from rayrollout.envkit.contract import Environment, Episode, Verification
from rayrollout.envkit.openenv.channel import OpenEnvChannel, OpenEnvError
from rayrollout.envkit.openenv.checks import PROBE_TIMEOUT_S, class_problem, server_problem
from rayrollout.envkit.openenv.inline import InlineChannel
from rayrollout.envkit.openenv.session import OpenEnvEpisode
from rayrollout.envkit.openenv.socket import SocketChannel
from rayrollout.envkit.reset_step.protocol import Opening, StepResult

__all__ = ["OpenEnvEnvironment"]

INSTALL = "pip install 'rayrollout[openenv]'"
_ENVIRONMENT_BASE = "openenv.core.env_server.interfaces:Environment"
_ACTION_BASE = "openenv.core.env_server.types:Action"


class OpenEnvEnvironment(Environment):
    """An OpenEnv environment by URL or by class, one instance per episode."""

    name = "openenv"
    source = "OpenEnv"
    default_hosting = "inline"  # the agent steps it from the worker (a client, or the class)
    default_agent = "reset_step"

    def __init__(
        self,
        task: Task,
        *,
        url: str | None = None,
        env_class: str | None = None,
        action_class: str | None = None,
        seed: int | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        describe_action: bool = True,
        timeout_s: float = 60.0,
    ) -> None:
        """
        Args:
            task: The episode's task; its ``seed`` and ``reset_kwargs`` win over the args.
            url: Base URL of a server running OpenEnv's app ('http://127.0.0.1:8000').
            env_class: 'module:Class' of an OpenEnv environment, made in the worker.
            action_class: 'module:Class' of its action, where the class does not say it.
            seed: The reset seed of rows without one.
            reset_kwargs: Other reset arguments of rows without their own.
            describe_action: Tell the model a typed action's JSON schema.
            timeout_s: How long one answer of a server may take.
        """
        super().__init__(task)
        if (url is None) == (env_class is None):
            raise OpenEnvError(
                "OpenEnv environment: give exactly one of 'url' (a server running OpenEnv's "
                "app) and 'env_class' (the class, made in the worker), in "
                "environments.NAME.args"
            )
        self.url = url
        self.env_class = env_class
        self.action_class = action_class
        self.timeout_s = timeout_s
        self.describe_action = describe_action
        data = dict(task.fields.get("reset_kwargs") or reset_kwargs or {})
        row_seed = task.fields.get("seed", seed)
        if row_seed is not None:
            data["seed"] = row_seed
        self.reset_data = data
        self.episode: OpenEnvEpisode | None = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None: by URL it needs nothing. By class it needs ``openenv``, which only the
        args say (this is asked of the class), so each episode's ``setup`` names the extra
        when it is missing."""
        return None

    @classmethod
    def config_problem(cls, args: dict[str, Any]) -> str | None:
        """The args name one server that answers as OpenEnv's, or one class that imports
        (see the module's docstring); None when they do."""
        url, env_class = args.get("url"), args.get("env_class")
        if (url is None) == (env_class is None):
            return (
                "OpenEnv environment: give exactly one of 'url' (a server running OpenEnv's "
                "app) and 'env_class' (the class, made in the worker) in environments.NAME.args"
            )
        if url is not None:
            return server_problem(str(url), PROBE_TIMEOUT_S)
        if importlib.util.find_spec("openenv") is None:
            return (
                f"OpenEnv environment {env_class}: the 'openenv' package is not installed; "
                f"{INSTALL}"
            )
        problem = class_problem(str(env_class), "env_class", _ENVIRONMENT_BASE)
        action = args.get("action_class")
        if problem is None and action is not None:
            problem = class_problem(str(action), "action_class", _ACTION_BASE)
        return problem

    def _channel(self) -> OpenEnvChannel:
        if self.url is not None:
            return SocketChannel(self.url, self.timeout_s)
        if importlib.util.find_spec("openenv") is None:
            raise OpenEnvError(
                f"OpenEnv environment {self.env_class}: the 'openenv' package is not "
                f"installed; {INSTALL}"
            )
        assert self.env_class is not None
        return InlineChannel(self.env_class, self.action_class)

    async def setup(self) -> None:
        self.episode = OpenEnvEpisode(self._channel(), self.reset_data, self.describe_action)
        await self.episode.open()

    async def reset(self, prompt: list[Message]) -> Opening:
        return await self._episode().reset(prompt)

    async def step(self, action: Message) -> StepResult:
        return await self._episode().step(action)

    async def verify(self, episode: Episode) -> Verification:
        return self._episode().verification()

    async def close(self) -> None:
        if self.episode is not None:
            await self.episode.close()

    def _episode(self) -> OpenEnvEpisode:
        if self.episode is None:
            raise OpenEnvError("OpenEnv environment: its session was never opened (no setup)")
        return self.episode
