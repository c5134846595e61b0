"""A NeMo Gym agent server as the agent of an episode: its own loop, our recorded model calls.

NeMo Gym's agents (``simple_agent`` and the others ``ng_run`` starts) play a whole episode
behind one ``POST /run``: they seed a session on their resources server, call the model
through their model server, run tools, verify, and answer with the verify response
(``reward``, ``response``). This agent hands each episode's task row to ``/run`` and takes
the answer as the episode's verdict, so NeMo Gym's agent logic runs unchanged. It is the
agent of NeMo Gym rows whose prompt that agent writes (``opening: agent``: an empty
``input``, as scicode's, gdpval's and legal_agent_bench's rows have), which the row names
itself. NeMo UserSim's rows name it too, and are refused at play: their environment server
speaks another protocol.

The model calls still have to be rayrollout's (token ids, logprobs, policy versions), so
each goes through the episode's recording gateway. A NeMo Gym model server has one static
``openai_base_url``, though, while every episode has its own gateway; so the run's NeMo
Gym model server points at the gateway front (``rayrollout.agentkit.gateway_front``) on
``gateway_port``, and each ``/run`` carries the episode's gateway address and key in
``responses_create_params.metadata``, which NeMo Gym passes through to its model server and
that on to the front. Configure it as::

    agent: nemo_gym
    agent_settings:
      nemo_gym:
        args: {url: "http://127.0.0.1:PORT_OF_THE_AGENT_SERVER", gateway_port: 18100}

with the NeMo Gym model server's ``openai_base_url: http://127.0.0.1:18100/v1``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from rayrollout.agentkit import Agent, AgentEpisode, EpisodeEnd, OutOfTurns
from rayrollout.agentkit.gateway_front import (
    GATEWAY_FIELD,
    KEY_FIELD,
    FrontKeeper,
    FrontPortTaken,
    front_metadata,
)
from rayrollout.data.json_text import json_object
from rayrollout.data.nemo_gym_rows import UNSUPPORTED
from rayrollout.data.responses import items_to_messages, seed_body
from rayrollout.data.schema import Message, Task
from rayrollout.envkit import Verification

if TYPE_CHECKING:
    from rayrollout.agentkit.gateway import GatewayEndpoint

__all__ = ["NemoGymAgent", "run_body"]

_NAME = "nemo_gym"
# What a verify answer holds beside the reward's explanation: the reward itself, the
# episode (kept as the transcript) and the request it echoes.
_NOT_DETAILS = frozenset({"reward", "response", "responses_create_params"})
_USERSIM_REFUSAL = (
    f"{UNSUPPORTED}: NeMo UserSim's episode protocol. This row is NeMo UserSim's "
    "{task_id, resolved_row}: NeMo Gym's nemo_user_sim environment server runs its simulated "
    "user and scores the simulation's own record, through its episode protocol (/run with "
    "{episode_id, task}), whose model calls carry no route to the episode's gateway; this "
    "agent plays agent servers' /run. Run this row with NeMo Gym"
)


class NemoGymAgent(Agent):
    """Play each episode with a NeMo Gym agent server's /run (e.g. simple_agent)."""

    name = _NAME

    def __init__(self, url: str, gateway_port: int, timeout_s: float = 600.0) -> None:
        """``url``: the NeMo Gym agent server's base URL (``/run`` is on it);
        ``gateway_port``: the loopback port of the gateway front, which the NeMo Gym model
        server's ``openai_base_url`` names; ``timeout_s``: how long one ``/run`` may take."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"agent '{_NAME}': url {url!r} is not an http(s) URL")
        if isinstance(gateway_port, bool) or not isinstance(gateway_port, int):
            raise ValueError(f"agent '{_NAME}': gateway_port {gateway_port!r} is not an integer")
        if not 1 <= gateway_port <= 65535:
            raise ValueError(f"agent '{_NAME}': gateway_port {gateway_port} is not a TCP port")
        if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"agent '{_NAME}': timeout_s {timeout_s!r} is not a positive number")
        self.url = url.rstrip("/")
        self.gateway_port = gateway_port
        self.timeout_s = float(timeout_s)
        self.front = FrontKeeper(gateway_port)
        self._http: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        """One connection pool per worker actor, made in its event loop on first use."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                # Each /run is a whole episode: no cookie may pass from one to the next.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._http

    async def play(self, episode: AgentEpisode) -> Verification:
        if "resolved_row" in episode.task.fields:
            raise EpisodeEnd("error", _USERSIM_REFUSAL)
        try:
            await self.front.ensure()
        except (FrontPortTaken, OSError) as exc:
            raise EpisodeEnd(
                "error", f"agent '{_NAME}': the gateway front on port {self.gateway_port}: {exc}"
            ) from None
        try:
            async with episode.gateway() as endpoint:
                body = run_body(episode.task, endpoint)
                answer = await self._run(body, endpoint.api_key)
        except OutOfTurns:
            if episode.task.opening != "agent":
                raise  # max_turns; the environment's verifier scores the transcript so far
            # The agent server wrote this opening and alone can score it (scicode's code is
            # in its /run, not the transcript): cut short, the episode has no verdict.
            raise EpisodeEnd(
                "max_turns",
                f"agent '{_NAME}': the NeMo Gym agent server at {self.url} made more model "
                f"calls than episode.max_turns ({episode.limits.max_turns}) allows, so its /run "
                "was cut short and gave no verdict: raise episode.max_turns in the config",
            ) from None
        if not episode.trajectory.turns:
            raise EpisodeEnd(
                "error",
                f"agent '{_NAME}': the NeMo Gym agent server at {self.url} answered /run "
                f"without one model call through the gateway front, so nothing was recorded: "
                f"set its model server's openai_base_url to "
                f"http://127.0.0.1:{self.gateway_port}/v1",
            )
        verdict = self._verdict(answer, body, endpoint.api_key)
        _complete_transcript(episode, body, answer.get("response"))
        return verdict

    async def _run(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        """POST /run; its JSON object, or ``EpisodeEnd`` saying what went wrong where (the
        episode's key blanked: a 422 echoes the request, and errors are written to the run)."""
        where = f"the NeMo Gym agent server at {self.url}"
        try:
            async with self._client().post(
                f"{self.url}/run",
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as response:
                status, text = response.status, await response.text(errors="replace")
                text = _without_secrets(text, key)
        except TimeoutError:
            raise EpisodeEnd(
                "timeout", f"agent '{_NAME}': {where} did not answer /run within {self.timeout_s}s"
            ) from None
        except aiohttp.ClientError as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise EpisodeEnd(
                "error",
                f"agent '{_NAME}': {where} did not answer POST /run ({reason}); check that it "
                f"is running and reachable (agent_settings.{_NAME}.args.url)",
            ) from None
        if status >= 400:
            raise EpisodeEnd(
                "error",
                f"agent '{_NAME}': {where} answered HTTP {status} to POST /run: {text[:500]}",
            )
        answer = json_object(text)
        if answer is None:
            raise EpisodeEnd(
                "error",
                f"agent '{_NAME}': {where} answered POST /run with something other than a JSON "
                f"object: {text[:300]}",
            )
        return answer

    def _verdict(self, answer: dict[str, Any], body: dict[str, Any], key: str) -> Verification:
        """The agent server's verify answer as the episode's verdict."""
        reward = answer.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise EpisodeEnd(
                "error",
                f"agent '{_NAME}': the NeMo Gym agent server at {self.url} answered /run "
                f"without a numeric 'reward': {_preview(_without_secrets(answer, key))}",
            )
        if not math.isfinite(reward):  # any finite reward stands as given (-1, 3, -100)
            raise EpisodeEnd(
                "error",
                f"agent '{_NAME}': the NeMo Gym agent server at {self.url} gave reward {reward}, "
                "which is not a finite number",
            )
        # A verify answer echoes its request; what it adds or changes explains the reward.
        details = {
            k: v
            for k, v in answer.items()
            if k not in _NOT_DETAILS and (k not in body or body[k] != v)
        }
        return Verification(reward=float(reward), details=_without_secrets(details, key))


def run_body(task: Task, endpoint: GatewayEndpoint) -> dict[str, Any]:
    """The ``/run`` body: the task's NeMo Gym row (or one built from the task) whose
    ``responses_create_params.metadata`` routes its model calls to this episode's gateway."""
    body = seed_body(task)  # a NeMo Gym row whole; else prompt and tools as Responses input
    params = dict(body["responses_create_params"])  # a copy: the task's row stays as read
    sampling = task.sampling
    if sampling is not None and "responses_create_params" not in task.fields:
        # A NeMo Gym row's sampling is in its own params already; a rayrollout row's is here.
        for name, value in (
            ("temperature", sampling.temperature),
            ("top_p", sampling.top_p),
            ("max_output_tokens", sampling.max_tokens),
        ):
            if value is not None:
                params.setdefault(name, value)
    metadata = params.get("metadata")
    params["metadata"] = {
        **(metadata if isinstance(metadata, dict) else {}),
        **front_metadata(endpoint.base_url, endpoint.api_key),
    }
    body["responses_create_params"] = params
    return body


def _preview(value: Any) -> str:
    """The start of ``value`` as JSON, for an error message."""
    return orjson.dumps(value, default=str)[:300].decode(errors="replace")


def _without_secrets(value: Any, key: str) -> Any:
    """``value`` without the front's metadata entries or the episode's key anywhere in it:
    verify answers echo what they were sent, and details are written to the run's files."""
    if isinstance(value, dict):
        return {
            k: _without_secrets(v, key)
            for k, v in value.items()
            if k not in (GATEWAY_FIELD, KEY_FIELD)
        }
    if isinstance(value, list):
        return [_without_secrets(v, key) for v in value]
    if isinstance(value, str) and key and key in value:
        return value.replace(key, "<episode key>")
    return value


def _complete_transcript(episode: AgentEpisode, body: dict[str, Any], response: Any) -> None:
    """Add to the transcript what the agent server's final ``response`` holds past the last
    recorded model call (tool answers after the last call, when its loop stopped there).

    The gateway set ``episode.messages`` to each call's history and reply; the final
    response's ``output`` is everything after the prompt, so the request's input plus that
    output, as messages, is the whole episode as the agent server saw it.
    """
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        return
    params = body["responses_create_params"]
    instructions = params.get("instructions")
    whole = [Message(role="system", content=instructions)] if instructions else []
    given = params.get("input")
    # One list, converted at once, as the gateway converted each call's input.
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
    whole += items_to_messages([*items, *response["output"]])
    recorded = episode.messages
    if len(whole) <= len(recorded) or not _same_shape(recorded, whole[: len(recorded)]):
        return
    episode.messages = [*recorded, *whole[len(recorded) :]]


def _same_shape(a: list[Message], b: list[Message]) -> bool:
    """Whether two transcripts are the same turns (roles and tool call ids), so one's tail can
    follow the other's; the text of a message may be normalized differently by each side."""

    def shape(message: Message) -> tuple[str, tuple[str, ...], str | None]:
        calls = tuple(call.id for call in message.tool_calls or [])
        return message.role, calls, message.tool_call_id

    return len(a) == len(b) and all(shape(x) == shape(y) for x, y in zip(a, b, strict=True))
