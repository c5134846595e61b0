"""The NeMo Gym resources-server protocol as HTTP routes of an environment's Serve app.

``/seed_session``, ``/<tool>``, ``/verify``, ``/close_session`` and ``/aggregate_metrics``,
in both forms NeMo Gym sends. An HTTP episode is keyed by a session cookie, forwarded by
handle to the replica holding its state; ``/verify`` ends the session.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures' types,
# and Serve's class-based views leave string annotations unresolved.
import asyncio
import json
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from rayrollout.auth import BearerTokenGate
from rayrollout.data.convert import chat_tools_to_responses
from rayrollout.data.responses import items_to_messages
from rayrollout.data.schema import Message, Task
from rayrollout.data.tasks import InvalidTaskError, parse_task_row
from rayrollout.envkit import Environment, Episode, ToolResult, Verification
from rayrollout.envkit.errors import EnvironmentRoutingError
from rayrollout.envkit.nemo_gym.aggregate_metrics import aggregate_metrics
from rayrollout.envkit.nemo_gym.client import PROTOCOL_ROUTES
from rayrollout.envkit.serve_batching import raised_on_replica
from rayrollout.envkit.tool_args import unknown_tool
from rayrollout.errors import EnvironmentBoundaryError

__all__ = ["SESSION_COOKIE", "NemoGymRoutes", "http_app"]

SESSION_COOKIE = "rayrollout_session"
http_app = FastAPI(title="rayrollout environment: NeMo Gym resources-server protocol")
# Every route runs the environment's code: only bearers of the replica's token get in
# (rayrollout/auth.py; the replica installs its RouteAuth when it starts).
http_app.add_middleware(BearerTokenGate)


class _HttpError(EnvironmentBoundaryError):
    """An HTTP request that cannot be served: its status and a message saying how to fix it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _session_key(request: Request) -> str | None:
    return request.cookies.get(SESSION_COOKIE) or request.headers.get("x-session-id")


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise _HttpError(400, f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _HttpError(400, f"the request body must be a JSON object, got {raw[:200]!r}")
    return body


def _task_from_row(row: dict[str, Any], env_name: str) -> Task:
    """The task a NeMo Gym client sent (its row, or a verify body less the response)."""
    try:
        return parse_task_row(row, default_environment=env_name, source="request")
    except InvalidTaskError as exc:
        raise _HttpError(
            422,
            f"{exc}. Send the task row: NeMo Gym's {{'responses_create_params': {{'input': "
            "...}}, ...verifier fields}} or rayrollout's {'prompt': ...}",
        ) from None


def _tool_response(result: ToolResult) -> Response:
    """A tool's result as the HTTP body NeMo Gym agents hand to the model (400 for errors)."""
    status = 400 if result.is_error else 200
    try:
        value = json.loads(result.content)
    except ValueError:
        value = None
    if isinstance(value, dict | list):
        return Response(result.content, status_code=status, media_type="application/json")
    return PlainTextResponse(result.content, status_code=status)


def _verify_answer(body: dict[str, Any], verification: Verification) -> dict[str, Any]:
    """NeMo Gym's verify answer: the request echoed, ``reward``, and the details beside it."""
    details = json.loads(json.dumps(verification.details, default=str))
    extra = {k: v for k, v in details.items() if k not in body and k != "reward"}
    return {**body, "reward": verification.reward, **extra}


def _no_session(key: str) -> Response:
    return JSONResponse(
        {
            "detail": f"session {key!r} is not open on this environment (closed, verified, idle "
            "past the environment's session timeout, or the replica restarted): POST "
            "/seed_session again to start a new episode"
        },
        status_code=404,
    )


def _failed(route: str, exc: Exception) -> Response:
    """An environment failure (setup, tool or verifier bug) as a 500 naming what raised."""
    cause = raised_on_replica(exc)
    return JSONResponse(
        {"detail": f"{route} failed: {type(cause).__name__}: {str(cause)[:1000]}"},
        status_code=500,
    )


_ASSIGN_TIMEOUT_S = 10.0  # a forwarded call no replica took by then was dropped by Ray's router
_ASSIGN_TRIES = 6


async def _assigned(send: Callable[[], Any], what: str) -> Any:
    """The answer of a forwarded handle call, sent again when Ray's router never gave it to a
    replica.

    Ray 2.60's experimental consistent-hash router now and then leaves a request pending for
    ever (seen on a loaded machine: a /verify that waited 300 s). A request still waiting for
    a replica after ``_ASSIGN_TIMEOUT_S`` is cancelled while unassigned (so it never runs)
    and sent again; one that a replica took is awaited whatever it takes, so no call runs
    twice.
    """
    for _ in range(_ASSIGN_TRIES):
        response = send()
        future = getattr(response, "_replica_result_future", None)
        if future is None:  # this replica's own method (_LocalCalls): nothing to route
            return await response
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), _ASSIGN_TIMEOUT_S)
        except TimeoutError:
            if future.cancel():  # still unassigned: it will never run
                continue
        return await response
    raise EnvironmentRoutingError(
        f"{what}: Ray Serve's router gave the call to no replica in {_ASSIGN_TRIES} tries of "
        f"{_ASSIGN_TIMEOUT_S:.0f} s; send it again"
    )


class _LocalCalls:
    """This replica's own methods in a handle's shape: ``calls.open.remote(...)``."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def __getattr__(self, method: str) -> Any:
        return SimpleNamespace(remote=getattr(self.server, method))


class NemoGymRoutes:
    """HTTP routes of NeMo Gym's protocol, forwarding to ``EnvironmentServer``'s methods."""

    env_cls: type[Environment]
    env_name: str  # the registered name: the default environment of rows that name none
    self_handle: DeploymentHandle | None = None
    route_locally: bool = False

    def _routed(self, key: str) -> Any:
        """Where session ``key``'s calls go: the replica holding it, through a handle with
        consistent-hash routing, or this replica itself when it is the only one.

        The local path is not only shorter: Ray's experimental consistent-hash router
        (2.60) left a burst of first calls from a fresh handle pending forever now and
        then (NeMo Gym's ng_collect_rollouts on `env serve`: 1 seed in 5 hung, 2 runs in 8).
        """
        if self.route_locally:
            return _LocalCalls(self)
        if self.self_handle is None:
            context = serve.get_replica_context()
            self.self_handle = serve.get_deployment_handle(context.deployment, context.app_name)
        return self.self_handle.options(session_id=key)

    @http_app.get("/")
    async def http_describe(self) -> dict[str, Any]:
        """The environment's name and tools (Responses-API function form, ``strict`` set)."""
        tools = chat_tools_to_responses(self.env_cls.tool_schemas())
        return {"environment": self.env_name, "tools": tools}

    @http_app.post("/seed_session")
    async def http_seed_session(self, request: Request) -> Response:
        """Start an episode from the task row in the body; the cookie names it from now on."""
        try:
            body = await _json_object(request)
            resources_session_id = body.get("resources_session_id")
            if resources_session_id is not None:  # an environment server's seed
                row = body.get("task_data")
                if not isinstance(row, dict) or not isinstance(resources_session_id, str):
                    raise _HttpError(
                        422,
                        "a seed with 'resources_session_id' (a string) needs 'task_data': the "
                        "task row as an object",
                    )
                task = _task_from_row(row, self.env_name)
            else:
                task = _task_from_row(body, self.env_name)
        except _HttpError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        key = resources_session_id or _session_key(request) or uuid.uuid4().hex
        try:
            await _assigned(lambda: self._routed(key).open.remote(key, task), "seed_session")
        except Exception as exc:
            return _failed("seed_session", exc)
        answer = {"resources_session_id": key} if resources_session_id else {"session_id": key}
        response = JSONResponse(answer)
        response.set_cookie(SESSION_COOKIE, key, httponly=True, samesite="lax")
        return response

    @http_app.post("/verify")
    async def http_verify(self, request: Request) -> Response:
        """Score a Responses-API episode; ends the session (NeMo Gym agents may not close)."""
        try:
            body = await _json_object(request)
            if not isinstance(body.get("response"), dict):
                raise _HttpError(422, "the body needs 'response': the episode, a Responses object")
            row = {k: v for k, v in body.items() if k != "response"}
            task = _task_from_row(row, self.env_name)
        except _HttpError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        output = body["response"].get("output") or []
        messages: list[Message] = [*task.prompt, *items_to_messages(output)]
        key = _session_key(request)
        scratch = key is None  # no session: score in a fresh one (setup runs, then close)
        key = key or uuid.uuid4().hex
        # A scratch session lives and ends inside this request, so it stays on this replica:
        # no other call will look for it, and the routing hop is where calls hung.
        handle = _LocalCalls(self) if scratch else self._routed(key)
        episode = Episode(task=task, messages=messages)
        try:
            if scratch:
                await handle.open.remote(key, task)
            # One routed call scores and releases the session (``close_after``). A separate
            # close was a second hop through Ray's router, where calls have hung: in CI
            # a /verify ran past its client's 60 s after its session was
            # scored and ended, and the client's retry found the session gone.
            verification = await _assigned(
                lambda: handle.verify.remote(key, episode, close_after=True), "verify"
            )
        except LookupError:
            return _no_session(key)
        except Exception as exc:
            return _failed("verify", exc)
        return JSONResponse(_verify_answer(body, verification))

    @http_app.post("/close_session")
    async def http_close_session(self, request: Request) -> Response:
        """Release the session's state (a no-op for an unknown or closed session).

        The session is the cookie's, or the body's ``resources_session_id`` (0.7.0's close
        body, which the answer echoes).
        """
        try:
            body = await _json_object(request)
        except _HttpError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        named = body.get("resources_session_id")
        key = named if isinstance(named, str) and named else _session_key(request)
        if key is not None:
            await _assigned(lambda: self._routed(key).close.remote(key), "close_session")
        return JSONResponse({"resources_session_id": named} if named else {})

    @http_app.post("/aggregate_metrics")
    async def http_aggregate_metrics(self, request: Request) -> Response:
        """Run-level figures of the verify answers in the body (``ng_collect_rollouts``)."""
        try:
            body = await _json_object(request)
            answers = body.get("verify_responses")
            if not isinstance(answers, list) or not all(isinstance(a, dict) for a in answers):
                raise _HttpError(
                    422, "the body needs 'verify_responses': a list of verify answers (objects)"
                )
        except _HttpError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        return JSONResponse(aggregate_metrics(answers))

    @http_app.post("/{tool_name}")
    async def http_call_tool(self, tool_name: str, request: Request) -> Response:
        """Run one tool call of the session; the body is the tool's JSON arguments."""
        if tool_name in PROTOCOL_ROUTES or tool_name not in self.env_cls._tool_specs:
            rejected = unknown_tool(tool_name, self.env_cls._tool_specs)
            return PlainTextResponse(str(rejected), status_code=404)
        key = _session_key(request)
        if key is None:
            return JSONResponse(
                {
                    "detail": "no session: POST /seed_session with the task row first, then "
                    f"send back its '{SESSION_COOKIE}' cookie (or an x-session-id header)"
                },
                status_code=400,
            )
        arguments = (await request.body()).decode("utf-8", errors="replace")
        try:
            result = await _assigned(
                lambda: self._routed(key).call_tool.remote(key, None, tool_name, arguments),
                tool_name,
            )
        except LookupError:
            return _no_session(key)
        except Exception as exc:
            return _failed(tool_name, exc)
        return _tool_response(result)
