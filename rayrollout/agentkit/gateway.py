"""The recording OpenAI-compatible gateway; one job: serving episodes' model calls over HTTP.

A program that calls the model itself is recorded: the per-episode sessions, keys and ends,
and the five routes that pass each call through ``AgentEpisode.model``. The request and
answer shapes, which are pure, live apart in ``openai_shapes``.

A program (an OpenAI SDK script, an agent framework) is handed a URL and a key instead of an
``AgentEpisode``: one loopback aiohttp server per worker, a path and key per episode, with
Chat Completions, Responses, models and tool routes. Every call goes through
``AgentEpisode.model``, so it is recorded token-exact; a call that ends the episode answers
410 Gone to it and every later one, so the program stops instead of retrying.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from aiohttp import web

from rayrollout.agentkit.contract import EpisodeEnd, OutOfTurns
from rayrollout.agentkit.openai_shapes import (
    BadRequest,
    chat_completion,
    chat_messages,
    chat_tools,
    responses_response,
    responses_tools,
    sampling_over,
)
from rayrollout.data.responses import items_to_messages
from rayrollout.data.schema import Message, SamplingParams, Turn

if TYPE_CHECKING:
    from rayrollout.agentkit.episode import AgentEpisode

__all__ = ["Gateway", "GatewayEndpoint", "TOOL_ERROR_HEADER"]

logger = logging.getLogger(__name__)

TOOL_ERROR_HEADER = "x-rayrollout-tool-error"
"""Set to ``1`` on a tool route's answer that is an error for the model to read."""

MAX_BODY = 64 * 2**20  # long transcripts: aiohttp's 1 MiB default would refuse them
_T = TypeVar("_T")
_End = EpisodeEnd | OutOfTurns


class _HttpError(Exception):
    """An answer other than 200, in OpenAI's error shape (the SDK reads ``error.message``)."""

    def __init__(
        self, status: int, message: str, kind: str, param: str | None = None, code: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {
            "error": {"message": message, "type": kind, "param": param, "code": code or None}
        }


def _bad(param: str, problem: str) -> _HttpError:
    """A 400 naming the field of the request that is wrong."""
    return _HttpError(400, f"{param}: {problem}", "invalid_request_error", param)


def _bad_request(exc: BadRequest) -> _HttpError:
    return _HttpError(400, str(exc), "invalid_request_error", exc.param)


class _Session:
    """One open episode: its key, its end once a call ran into one, its calls in flight."""

    def __init__(self, episode: AgentEpisode, api_key: str) -> None:
        self.episode = episode
        self.api_key = api_key
        self.lock = asyncio.Lock()  # one model call at a time: the transcript is one sequence
        self.end: _End | None = None
        self.ended = asyncio.Event()
        self.closed = False
        self.calls: set[asyncio.Future[Any]] = set()
        self.responses: dict[str, list[Message]] = {}  # response id -> its input and reply

    def finish(self, end: _End) -> None:
        """Record what ended the episode (the first end wins)."""
        if self.end is None:
            self.end = end
            self.ended.set()

    def check_open(self) -> None:
        """Refuse a call to an episode that closed (404) or ended (410)."""
        if self.closed:
            raise _HttpError(404, "this episode is closed", "not_found_error")
        if self.end is not None:
            status = "max_turns" if isinstance(self.end, OutOfTurns) else self.end.status
            raise _HttpError(
                410, f"the episode is over ({status}): {self.end}", "episode_ended", code=status
            )

    def close(self) -> None:
        """Forget the episode: calls still running are cancelled (their turn would land in a
        trajectory already handed back), later ones find nothing."""
        self.closed = True
        for call in list(self.calls):
            call.cancel()


@dataclass(frozen=True)
class GatewayEndpoint:
    """Where one episode's program reaches the model and the tools, and with which key.

    ``api_key`` stays out of the repr (it is a secret: a logged endpoint shows no key).
    """

    base_url: str
    api_key: str = field(repr=False)
    tools_url: str
    _session: _Session = field(repr=False, compare=False)

    @property
    def end(self) -> EpisodeEnd | OutOfTurns | None:
        """What ended the episode during a call through the gateway; None while none did."""
        return self._session.end

    async def wait_end(self) -> EpisodeEnd | OutOfTurns:
        """Wait until a call through the gateway ends the episode; returns that end."""
        await self._session.ended.wait()
        assert self._session.end is not None
        return self._session.end


class Gateway:
    """The worker actor's gateway server and its open episodes (``GatewayOpener``).

    Cheap to make: nothing is bound until the first ``open``. ``close`` stops the server.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._url: str | None = None
        self._runner: web.AppRunner | None = None
        self._starting: asyncio.Lock | None = None
        self._sessions: dict[str, _Session] = {}

    @property
    def url(self) -> str | None:
        """``http://127.0.0.1:PORT`` once started, else None."""
        return self._url

    @property
    def open_episodes(self) -> int:
        """Episodes whose endpoint is open now (a leak check for tests and benchmarks)."""
        return len(self._sessions)

    async def start(self) -> str:
        """Start the server if it is not running; returns its URL."""
        if self._url is not None:
            return self._url
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._url is None:
                self._runner, self._url = await self._serve()
        return self._url

    async def _serve(self) -> tuple[web.AppRunner, str]:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors])
        base = "/e/{token}/v1"
        app.router.add_post(f"{base}/chat/completions", self._chat_completions)
        app.router.add_post(f"{base}/responses", self._responses)
        app.router.add_get(f"{base}/models", self._models)
        app.router.add_get("/e/{token}/tools", self._tool_schemas)
        app.router.add_post("/e/{token}/tools/{name}", self._tool_call)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=1024)
        await site.start()
        port = runner.addresses[0][1]
        return runner, f"http://{self.host}:{port}"

    async def close(self) -> None:
        """Stop the server; open episodes are closed (their calls cancelled)."""
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()
        runner, self._runner, self._url = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    @asynccontextmanager
    async def open(self, episode: AgentEpisode) -> AsyncIterator[GatewayEndpoint]:
        """The episode's endpoint for the block; afterwards its address answers 404.

        Raises, when the block ends, the ``EpisodeEnd`` or ``OutOfTurns`` a call through the
        gateway ran into (whatever the program made of the error it was answered), so the
        episode ends with that status.
        """
        url = await self.start()
        token = secrets.token_urlsafe(16)
        session = _Session(episode, "rr-" + secrets.token_urlsafe(32))
        self._sessions[token] = session
        endpoint = GatewayEndpoint(
            f"{url}/e/{token}/v1", session.api_key, f"{url}/e/{token}/tools", session
        )
        try:
            yield endpoint
        except Exception as exc:
            if session.end is not None and session.end is not exc:
                raise session.end from exc
            raise
        finally:
            self._sessions.pop(token, None)
            session.close()
        if session.end is not None:
            raise session.end

    # ------------------------------------------------------------------ plumbing

    def _session(self, request: web.Request) -> _Session:
        """The request's open episode, its key checked (404 unknown, 401 wrong key)."""
        session = self._sessions.get(request.match_info["token"])
        if session is None:
            raise _HttpError(
                404, "no open episode at this address (it ended, or never was)", "not_found_error"
            )
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), session.api_key.encode()
        ):
            raise _HttpError(
                401,
                "missing or wrong API key for this episode: send Authorization: Bearer "
                "<OPENAI_API_KEY of the episode>",
                "authentication_error",
                code="invalid_api_key",
            )
        session.check_open()
        return session

    async def _guarded(self, session: _Session, call: Coroutine[Any, Any, _T]) -> _T:
        """Run one call of the episode: what ends the episode is recorded on its session and
        answered 410; the session closing under the call answers 404."""
        task = asyncio.ensure_future(call)
        session.calls.add(task)
        task.add_done_callback(session.calls.discard)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                raise _HttpError(
                    404, "the episode closed during the call", "not_found_error"
                ) from None
            raise
        except (EpisodeEnd, OutOfTurns) as end:
            session.finish(end)
            session.check_open()  # raises the 410
            raise
        except _HttpError:
            raise
        except Exception as exc:  # a bug here must end the episode, not loop the program
            logger.exception("gateway call failed")
            message = f"the gateway's call failed: {type(exc).__name__}: {exc}"
            session.finish(EpisodeEnd("error", message))
            raise _HttpError(500, message, "server_error") from exc

    async def _model(
        self,
        session: _Session,
        messages: list[Message],
        tools: list[dict[str, Any]],
        sampling: SamplingParams | None,
    ) -> tuple[Message, Turn]:
        """One recorded model call; the transcript becomes ``messages`` + the reply."""
        episode = session.episode

        async def call() -> tuple[Message, Turn]:
            _rebase(episode, messages)
            reply = await episode.model(messages, tools=tools, sampling=sampling)
            episode.messages.append(reply)
            return reply, episode.trajectory.turns[-1]

        async with session.lock:
            session.check_open()
            return await self._guarded(session, call())

    # ------------------------------------------------------------------ routes

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        body = await _json_body(request)
        if body.get("n") not in (None, 1):
            raise _bad("n", "the gateway answers one choice per call")
        messages = chat_messages(body.get("messages"))
        tools = chat_tools(body.get("tools"))
        sampling = sampling_over(
            session.episode.task.sampling,
            body,
            {"max_completion_tokens": "max_tokens", "max_tokens": "max_tokens"},
        )
        reply, turn = await self._model(session, messages, tools, sampling)
        model = session.episode.policy.config.model
        completion = chat_completion(reply, turn, model)
        if not body.get("stream"):
            return _json(completion)
        options = body.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return await _stream_chat(request, completion, usage)

    async def _responses(self, request: web.Request) -> web.Response:
        session = self._session(request)
        body = await _json_body(request)
        if body.get("stream"):
            raise _bad("stream", "streaming is not supported on /responses; send stream: false")
        earlier: list[Message] = []
        previous_id = body.get("previous_response_id")
        if previous_id is not None:
            found = session.responses.get(str(previous_id))
            if found is None:
                raise _bad("previous_response_id", f"no response {previous_id!r} in this episode")
            earlier = found
        raw_input = body.get("input")
        if not isinstance(raw_input, str | list):
            raise _bad("input", "must be a string or a list of input items")
        try:
            conversation = [*earlier, *items_to_messages(raw_input)]
        except ValueError as exc:  # an image part that cannot be read (pydantic's error)
            raise _bad("input", str(exc).splitlines()[-1].strip()) from None
        if not conversation:
            raise _bad("input", "holds no message")
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise _bad("instructions", "must be a string")
        system = [Message(role="system", content=instructions)] if instructions else []
        tools = responses_tools(body.get("tools"))
        sampling = sampling_over(
            session.episode.task.sampling, body, {"max_output_tokens": "max_tokens"}
        )
        reply, turn = await self._model(session, [*system, *conversation], tools, sampling)
        response_id = f"resp_{uuid.uuid4().hex}"
        session.responses[response_id] = [*conversation, reply]
        model = session.episode.policy.config.model
        return _json(responses_response(response_id, reply, turn, model, body))

    async def _models(self, request: web.Request) -> web.Response:
        session = self._session(request)
        model = session.episode.policy.config.model
        return _json(
            {
                "object": "list",
                "data": [{"id": model, "object": "model", "created": 0, "owned_by": "rayrollout"}],
            }
        )

    async def _tool_schemas(self, request: web.Request) -> web.Response:
        return _json(self._session(request).episode.tools)

    async def _tool_call(self, request: web.Request) -> web.Response:
        session = self._session(request)
        name = request.match_info["name"]
        arguments = (await request.read()).decode("utf-8", errors="replace").strip() or "{}"
        result = await self._guarded(session, session.episode.call_tool(name, arguments))
        headers = {TOOL_ERROR_HEADER: "1"} if result.is_error else None
        return web.Response(text=result.content, content_type="text/plain", headers=headers)


def _rebase(episode: AgentEpisode, messages: list[Message]) -> None:
    """Make ``messages`` the episode's transcript (what the program sent is what happened).

    Turns record what they sent as a count of the transcript's first messages. When the
    program sends a history that does not extend the transcript (it trimmed or rewrote
    it), the earlier turns whose counted messages would now read differently get the
    messages themselves instead, so every turn still says exactly what it sent.
    """
    old = episode.messages
    kept = 0  # how many first messages the new transcript shares with the old one
    for a, b in zip(old, messages, strict=False):
        if a is not b and a != b:
            break
        kept += 1
    if kept < len(old):
        for turn in episode.trajectory.turns:
            count = turn.prompt_message_count
            if turn.sent_messages is None and count > kept:
                turn.sent_messages, turn.prompt_message_count = old[:count], 0
    episode.messages = list(messages)


# ---------------------------------------------------------------------- HTTP helpers


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """``_HttpError`` as its JSON answer; aiohttp's own (405 and such) pass through."""
    try:
        return await handler(request)
    except BadRequest as exc:
        error = _bad_request(exc)
        return _json(error.body, error.status)
    except _HttpError as exc:
        return _json(exc.body, exc.status)


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _HttpError(400, "the body is not JSON", "invalid_request_error") from None
    if not isinstance(body, dict):
        raise _HttpError(400, "the body must be a JSON object", "invalid_request_error")
    return body


async def _stream_chat(
    request: web.Request, completion: dict[str, Any], usage: bool
) -> web.StreamResponse:
    """The whole completion as a server-sent-event stream: one delta, the finish, [DONE].

    Agent frameworks that always stream still work; the reply is not generated token by
    token here, it is complete before the first byte goes out.
    """
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    head = {k: completion[k] for k in ("id", "created", "model")}
    chunks = [
        {"choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "finish_reason": choice["finish_reason"],
                    "logprobs": None,
                }
            ]
        },
    ]
    if usage:
        chunks.append({"choices": [], "usage": completion["usage"]})
    for chunk in chunks:
        event = {**head, "object": "chat.completion.chunk", **chunk}
        await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
