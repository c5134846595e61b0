"""NeMo Gym's server protocol, client side; one job: an episode's every call to a NeMo Gym server.

``RemoteSession`` is the third ``EnvSession`` kind: an episode against a running resources
server (``--env-url NAME=URL``; ``/seed_session``, ``/<tool>``, ``/verify``,
``/close_session``), with a cookie jar per episode over one pool per worker. A Gymnasium
server is stepped by ``gymnasium``, a seeded row by ``seeded``; the agent follows from the
row, else from the server's kind (``remote_environment``), as in NeMo Gym's own runs.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import uuid
from typing import Any

import aiohttp
import orjson

from rayrollout.auth import bearer_header, read_token_file
from rayrollout.data.config import EnvironmentConfig
from rayrollout.data.convert import json_or_text
from rayrollout.data.nemo_gym_agents import agent_for_row
from rayrollout.data.responses import (
    episode_response,
    items_to_messages,
    responses_create_params,
    seed_body,
)
from rayrollout.data.schema import Task
from rayrollout.envkit import Environment, Episode, ToolResult, Verification
from rayrollout.envkit.errors import NemoGymError
from rayrollout.envkit.nemo_gym.gymnasium import GymnasiumEpisode
from rayrollout.envkit.nemo_gym.seeded import (
    SeededEpisode,
    opens_sandbox,
    sandbox_refusal,
    seed_refusal,
)
from rayrollout.envkit.reset_step import ResetStepError
from rayrollout.envkit.tool_args import ToolCallRejected, parse_arguments, unknown_tool

__all__ = [
    "PROTOCOL_ROUTES",
    "GymnasiumServerEnvironment",
    "NemoGymConnections",
    "NemoGymError",
    "RemoteEnvironment",
    "RemoteSession",
    "episode_response",
    "items_to_messages",
    "remote_environment",
    "responses_create_params",
    "rollout_id",
    "seed_body",
]

PROTOCOL_ROUTES = frozenset({"seed_session", "verify", "close_session", "aggregate_metrics"})
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_JSON = {"Content-Type": "application/json"}
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_NOT_DETAILS = frozenset({"reward", "response", "responses_create_params"})
_BACKOFF_S = 0.25
_MAX_BACKOFF_S = 4.0


class RemoteEnvironment(Environment):
    """Stand-in class for an environment that lives on a NeMo Gym server.

    The episode loop asks the environment class for its tool schemas only when the task
    carries none; a remote server publishes no schemas (NeMo Gym rows carry them in
    ``responses_create_params.tools``), so it offers none. All real work is in
    ``RemoteSession``.
    """

    name = "nemo_gym_remote"

    @classmethod
    def agent_for(cls, task: Task) -> str | None:
        """The agent NeMo Gym's own run would play ``task`` with (``agent_for_row``): a row
        opened by ``/seed_session`` or naming a ``gymnasium_agent`` in its ``agent_ref`` is
        stepped by ``reset_step``, one whose opening NeMo Gym's agent writes is the
        ``nemo_gym`` agent's, one naming a ``simple_agent`` the tool loop's. A row's own
        ``agent`` and the run's ``--agent`` still come first (``resolve_agent``)."""
        return agent_for_row(task)

    async def verify(self, episode: Episode) -> Verification:
        raise NotImplementedError("a remote environment is verified by its server's /verify")


class GymnasiumServerEnvironment(RemoteEnvironment):
    """A NeMo Gym server of the Gymnasium kind (``protocol: gymnasium``): rows naming no
    NeMo Gym agent are stepped by ``reset_step``, as its ``gymnasium_agent`` would."""

    @classmethod
    def agent_for(cls, task: Task) -> str | None:
        return agent_for_row(task) or "reset_step"


def remote_environment(settings: EnvironmentConfig) -> type[RemoteEnvironment]:
    """The stand-in class of the server at ``settings.url``, by its ``protocol``."""
    return GymnasiumServerEnvironment if settings.protocol == "gymnasium" else RemoteEnvironment


class NemoGymConnections:
    """One worker's HTTP connection pool, shared by all its remote episodes.

    Created lazily inside the worker's event loop (aiohttp connectors bind to the loop that
    first uses them); cookies are never kept here, only in each episode's session.
    """

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self._connector: aiohttp.TCPConnector | None = None
        self._tokens: dict[str, dict[str, str]] = {}  # token file -> its Authorization header

    def auth_headers(self, config: EnvironmentConfig) -> dict[str, str]:
        """The ``Authorization`` header for ``config.token_file`` (read once), or none."""
        path = config.token_file
        if path is None:
            return {}
        if path not in self._tokens:
            try:
                self._tokens[path] = bearer_header(read_token_file(path))
            except ValueError as exc:
                raise NemoGymError(f"{exc} (environments.*.token_file)") from None
        return self._tokens[path]

    def connector(self) -> aiohttp.TCPConnector:
        if self._connector is None or self._connector.closed:
            self._connector = aiohttp.TCPConnector(limit=self.limit, keepalive_timeout=30)
        return self._connector

    def session(
        self, name: str, config: EnvironmentConfig, task: Task, episode_id: str = ""
    ) -> RemoteSession:
        """A new episode's session against the server at ``config.url``."""
        if config.url is None:
            raise ValueError(f"environment '{name}' has no url: set environments.{name}.url")
        return RemoteSession(self, name, config, task, episode_id)

    async def close(self) -> None:
        if self._connector is not None:
            await self._connector.close()


class RemoteSession:
    """One episode on a NeMo Gym resources server: seed, tool calls, verify, close.

    Transient failures (connection errors, timeouts, 429 and 5xx) are retried with
    exponential backoff up to ``max_retries`` times, tool calls included: a resources server
    answering 5xx has, by the protocol's convention, not applied the call. A 4xx answer to
    a tool call is the model's mistake (unknown tool, arguments the server rejects) and is
    shown to the model as a tool error; what remains after the retries ends the episode
    with ``status="error"`` naming the server, the route and its answer.
    """

    def __init__(
        self,
        pool: NemoGymConnections,
        name: str,
        config: EnvironmentConfig,
        task: Task,
        episode_id: str = "",
    ) -> None:
        self.pool = pool
        self.session_id = rollout_id(episode_id or uuid.uuid4().hex)
        self.name = name
        self.config = config
        self.base_url = (config.url or "").rstrip("/")
        self.task = task
        self.tool_names = (
            None if task.tools is None else {t["function"]["name"] for t in task.tools}
        )
        self.http: aiohttp.ClientSession | None = None
        self.seeded = False
        self.earlier_failure = ""  # the last request's failed attempt before its answer
        # EnvSession's flag for a replica that died under the episode: a server's failures
        # are retried here and then end the episode, so it is never lost in that sense.
        self.lost = False
        # Set by ``setup`` when the server is Gymnasium-style (no /seed_session), or opened
        # the episode with its first observation (the task's ``opening``): the reset/step
        # side the ``reset_step`` agent plays (``reset_step_session`` finds it).
        self.env: GymnasiumEpisode | SeededEpisode | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self.http is None:
            # One cookie jar per episode: the server's session cookie identifies this
            # episode's state. unsafe=True accepts cookies from IP hosts (127.0.0.1).
            self.http = aiohttp.ClientSession(
                connector=self.pool.connector(),
                connector_owner=False,
                cookie_jar=aiohttp.CookieJar(unsafe=True),
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_s),
                headers=self.pool.auth_headers(self.config),
            )
        return self.http

    async def _post(self, route: str, body: Any, retry: bool = True) -> tuple[int, str]:
        """POST with retries (none where ``retry`` is false: a call that must not run twice);
        returns the last (status, text) unless it never connected."""
        url = f"{self.base_url}/{route}"
        client = self._client()
        # orjson, not aiohttp's json= (the standard library's encoder): about a tenth of an
        # worker's CPU per URL episode went to encoding these bodies.
        data = orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        attempts = self.config.max_retries + 1 if retry else 1
        problem = ""
        for attempt in range(attempts):
            try:
                async with client.post(url, data=data, headers=_JSON) as response:
                    text = await response.text()
                    if response.status not in _RETRY_STATUSES or attempt == attempts - 1:
                        # Said with an error: a retried /verify finds its session already
                        # ended by the attempt that failed, so the first failure is the cause.
                        self.earlier_failure = problem
                        return response.status, text
                    problem = f"HTTP {response.status}: {text[:300]}"
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if attempt == attempts - 1:
                    break
            delay = min(_MAX_BACKOFF_S, _BACKOFF_S * 2**attempt)
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
        raise NemoGymError(
            f"NeMo Gym server '{self.name}' at {self.base_url} did not answer POST /{route} "
            f"after {attempts} attempt(s) ({problem}); check that it is running and reachable "
            f"(environments.{self.name}.url)"
        )

    def _fail(self, route: str, status: int, text: str) -> NemoGymError:
        earlier = self.earlier_failure and f" (after a failed attempt: {self.earlier_failure})"
        return NemoGymError(
            f"NeMo Gym server '{self.name}' at {self.base_url} answered HTTP {status} to "
            f"POST /{route}: {text[:500]}{earlier}"
        )

    async def setup(self) -> None:
        if self.task.opening == "agent":
            # NeMo Gym's agent (or environment) server writes the opening and seeds its own
            # session on its resources server: nothing of this episode is opened here.
            return
        where = f"NeMo Gym server '{self.name}' at {self.base_url}"
        seeded = self.task.opening == "seed_session"
        if seeded and opens_sandbox(self.task):
            raise NemoGymError(sandbox_refusal(where))
        status, text = await self._post("seed_session", seed_body(self.task))
        if seeded:
            if status >= 400:
                raise self._fail("seed_session", status, text)
            self.seeded = True
            answer = _json_object(text)
            if answer is None or "obs" not in answer:
                raise NemoGymError(seed_refusal(where, answer or {}))
            try:
                self.env = SeededEpisode(self._post, where, self.task, answer)
            except ResetStepError as exc:
                raise NemoGymError(str(exc)) from None
            return
        if status == 404:
            # No /seed_session: a Gymnasium-style server (/reset, /step), played by the
            # reset_step agent; its reset says so if the server has no /reset either.
            setting = f"environments.{self.name}.url"
            self.env = GymnasiumEpisode(self._post, where, self.task, setting)
            return
        if status >= 400:
            raise self._fail("seed_session", status, text)
        self.seeded = True

    async def call_tool(self, name: str, arguments: str) -> ToolResult:
        if isinstance(self.env, SeededEpisode):
            raise NemoGymError(
                f"NeMo Gym server '{self.name}' at {self.base_url} opened this episode in "
                f"/seed_session (env_id {self.env.env_id}): its actions go through /step, not "
                f"tool routes (tool '{name}'); play it with the reset_step agent (--agent "
                "reset_step, or the row's 'agent')"
            )
        if self.env is not None:
            raise NemoGymError(
                f"NeMo Gym server '{self.name}' at {self.base_url} is a Gymnasium-style server: "
                f"its actions go through /step, not tool routes (tool '{name}'); play it with "
                "the reset_step agent (--agent reset_step, or the row's 'agent')"
            )
        try:
            if (self.tool_names is not None and name not in self.tool_names) or (
                not _TOOL_NAME.match(name) or name in PROTOCOL_ROUTES
            ):
                raise unknown_tool(name, self.tool_names or ())
            args = parse_arguments(name, arguments)  # the server validates them against its schema
        except ToolCallRejected as exc:
            return ToolResult(content=str(exc), is_error=True)
        status, text = await self._post(name, args)
        if status >= 500:
            raise self._fail(name, status, text)
        content = json_or_text(text, str)  # a JSON string unwrapped, else the body as is
        if status >= 400:
            error = content if content.startswith("Error") else f"Error: {content}"
            return ToolResult(content=error, is_error=True)
        return ToolResult(content=content)

    async def verify(self, episode: Episode) -> Verification:
        if self.task.opening == "agent":
            # Only the agent server's /run answer scores it: it alone holds what its own
            # verify needs (scicode's collected code), so the environment session has nothing
            # to send.
            raise NemoGymError(
                f"this task's opening and verdict are NeMo Gym's agent server's (the "
                f"'nemo_gym' agent), and the episode ended before its /run answered; if it "
                f"ended at max_turns, raise episode.max_turns to the model calls that agent "
                f"makes (NeMo Gym server '{self.name}' was not asked)"
            )
        if isinstance(self.env, SeededEpisode):  # /close, then /verify by env_id
            try:
                return await self.env.verify(episode.messages)
            except ResetStepError as exc:
                raise NemoGymError(str(exc)) from None
        if self.env is not None:  # Gymnasium-style: /verify raises there; the steps scored it
            return self.env.verification()
        # The whole task row, as NeMo Gym's own agents send it: verifiers read their own
        # fields from it (expected_result, id, ...) and 422 without them.
        body = {**seed_body(self.task), "response": episode_response(self.task, episode.messages)}
        status, text = await self._post("verify", body)
        if status >= 400:
            raise self._fail("verify", status, text)
        try:
            answer = orjson.loads(text)  # it echoes the whole request: a tenth of json's time
            reward = float(answer["reward"])
        except (ValueError, TypeError, KeyError):
            raise NemoGymError(
                f"NeMo Gym server '{self.name}' answered /verify without a numeric 'reward': "
                f"{text[:300]}"
            ) from None
        # Any finite reward stands as the server gave it (-1, 0 to 3, -100); a reward sent as
        # the text "NaN" or "inf" reads as a float that is not one.
        if not math.isfinite(reward):
            raise NemoGymError(
                f"NeMo Gym server '{self.name}' gave reward {answer['reward']!r}, which is not "
                "a finite number"
            )
        # A verify answer echoes its request (the episode and request re-serialized by the
        # server's models); what it adds or changes beside them explains the reward.
        details = {
            k: v
            for k, v in answer.items()
            if k not in _NOT_DETAILS and (k not in body or body[k] != v)
        }
        return Verification(reward=reward, details=details)

    def close_body(self) -> dict[str, Any]:
        """``/close_session``'s body in 0.7.0's form: the session and the episode it served.

        The server's state is keyed by its cookie (sent with the request) or by this id; a
        server with nothing to release answers either way.
        """
        return {
            "resources_session_id": self.session_id,
            "episode_id": {"rollout_id": self.session_id, "attempt": 0},
        }

    async def close(self) -> None:
        if self.http is None:
            return
        try:
            if isinstance(self.env, SeededEpisode):
                await self.env.release()  # a failed episode's environment too
            elif self.env is not None:
                await self.env.close()
                return
            if not self.seeded:  # no session was opened, so there is none to close
                return
            status, text = await self._post("close_session", self.close_body())
            # Older resources servers have no /close_session: nothing to release there.
            if status >= 400 and status not in (404, 405):
                raise self._fail("close_session", status, text)
        finally:
            await self.http.close()
            self.http = None


def _json_object(text: str) -> dict[str, Any] | None:
    """A JSON object's body, or None where it is not one."""
    try:
        answer = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return answer if isinstance(answer, dict) else None


def rollout_id(episode_id: str) -> str:
    """An episode id in the form NeMo Gym's ``EpisodeId.rollout_id`` accepts.

    That field allows ``[A-Za-z0-9._-]`` and must start with a letter or digit; rayrollout's
    ids (``task:sample:hex``) carry the task id, which may hold anything.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", episode_id)
    return safe if safe[:1].isalnum() else f"r{safe}"
