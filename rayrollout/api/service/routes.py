"""The rollout service's HTTP routes (aiohttp), each a thin frame around ``RolloutService``.

=======  ===================================  ==============================================
method   path                                 what
=======  ===================================  ==============================================
POST     /v1/batches                          submit tasks x n (201; 200 for a known batch id)
GET      /v1/batches/{id}                     the batch's progress
GET      /v1/batches/{id}/trajectories        its rows as JSON lines from ``?cursor=k``
POST     /v1/batches/{id}/ack                 ``{"cursor": k}``: rows below k are consumed
DELETE   /v1/batches/{id}                     forget it
POST     /v1/pause, /v1/resume, /v1/weights   the training loop's calls
GET      /v1/stats, /v1/info                  the engine's figures; the run and the limits
POST     /run                                 NeMo Gym's agent-server call
POST     /aggregate_metrics                   NeMo Gym's run figures of /run answers
GET      /openapi.json                        these routes as OpenAPI 3.1 (``openapi``)
=======  ===================================  ==============================================

aiohttp rather than a Serve app: the service is one actor holding its batches, and aiohttp
(the recording gateway's server too) streams a response with no proxy hop between the
engine's rows and the client. Every route wants the run's bearer token, checked by the run's
``RouteAuth`` as on every other HTTP route of rayrollout; ``/run`` goes without only where
the config says so (NeMo Gym's tools send none). A body is read by ``bodies`` (JSON, bounded
in depth) before anything else touches it; an exception no route expected answers a JSON
500 naming its type, and never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from rayrollout.api.service.bodies import parse_body, parse_cursor
from rayrollout.api.service.core import HttpError, RolloutService
from rayrollout.api.service.nemo_gym_run import run_nemo_gym
from rayrollout.api.service.openapi import openapi
from rayrollout.auth import RouteAuth
from rayrollout.envkit.nemo_gym.aggregate_metrics import aggregate_metrics

__all__ = ["build_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = logging.getLogger(__name__)
_STREAMING = "rayrollout.streaming"  # set on a request once its streamed answer has begun


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(payload, default=str), status=status, content_type="application/json"
    )


async def _body(request: web.Request) -> Any:
    return parse_body(await request.read())


def _gate(auth: RouteAuth, open_paths: frozenset[str]) -> Any:
    @web.middleware
    async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in open_paths and not auth.accepts(
            request.headers.get("Authorization")
        ):
            sent = "Authorization" in request.headers
            why = "the bearer token is wrong" if sent else "no bearer token was sent"
            return _json(
                {
                    "detail": f"401 Unauthorized: {why}. The rollout service takes "
                    "'Authorization: Bearer <token>': the run's token, in the file "
                    "`rayrollout status` names (token_file)"
                },
                401,
            )
        try:
            return await handler(request)
        except HttpError as exc:
            return _json(exc.body, exc.status)
        except web.HTTPException:
            raise  # aiohttp's own answers (413 for a body over max_body_mb, 404, 405)
        except Exception as exc:  # a bug: said by its type, logged whole, never a traceback
            if isinstance(exc, ConnectionError) or request.get(_STREAMING):
                raise  # the client went away, or a stream was under way: aiohttp closes it
            log.exception("%s %s failed", request.method, request.path)
            detail = f"the service failed: {type(exc).__name__}: {exc}"[:500]
            return _json({"detail": f"{detail} (the service's log has the rest)"}, 500)

    return gate


def build_app(service: RolloutService, auth: RouteAuth) -> web.Application:
    """The aiohttp application of ``service``, behind ``auth``."""
    settings = service.config.service
    nemo_gym_paths = {"/run", "/aggregate_metrics"}
    open_paths = frozenset(nemo_gym_paths if settings.nemo_gym_run_without_token else ())
    app = web.Application(
        client_max_size=int(settings.max_body_mb * 2**20), middlewares=[_gate(auth, open_paths)]
    )

    async def submit(request: web.Request) -> web.Response:
        status, answer = await service.submit(await _body(request))
        return _json(answer, status)

    async def batch(request: web.Request) -> web.Response:
        return _json(service.batch(request.match_info["batch_id"]).status())

    async def delete(request: web.Request) -> web.Response:
        return _json(service.delete(request.match_info["batch_id"]))

    async def ack(request: web.Request) -> web.Response:
        return _json(service.acknowledge(request.match_info["batch_id"], await _body(request)))

    async def trajectories(request: web.Request) -> web.StreamResponse:
        cursor = parse_cursor(request.query.get("cursor", "0"))
        lines = service.open_stream(request.match_info["batch_id"], cursor)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        request[_STREAMING] = True
        async for chunk in lines:
            await response.write(chunk)  # waits while the client's socket is full
        await response.write_eof()
        return response

    async def pause(request: web.Request) -> web.Response:
        return _json(await service.pause(await _body(request)))

    async def resume(request: web.Request) -> web.Response:
        return _json(await service.call_engine("resume"))

    async def weights(request: web.Request) -> web.Response:
        return _json(await service.update_weights(await _body(request)))

    async def stats(request: web.Request) -> web.Response:
        return _json(await service.stats())

    async def info(request: web.Request) -> web.Response:
        return _json(await service.info())

    async def run(request: web.Request) -> web.Response:
        status, answer = await run_nemo_gym(service, await _body(request))
        return _json(answer, status)

    async def aggregate(request: web.Request) -> web.Response:
        body = await _body(request)
        answers = body.get("verify_responses") if isinstance(body, dict) else None
        if not isinstance(answers, list) or not all(isinstance(a, dict) for a in answers):
            raise HttpError(
                400,
                "field 'verify_responses': a list of /run answers (objects)",
                field="verify_responses",
            )
        return _json(aggregate_metrics(answers))

    schema = openapi()

    async def describe(request: web.Request) -> web.Response:
        return _json(schema)

    one = "/v1/batches/{batch_id}"
    app.router.add_post("/v1/batches", submit)
    app.router.add_get(one, batch)
    app.router.add_delete(one, delete)
    app.router.add_post(f"{one}/ack", ack)
    app.router.add_get(f"{one}/trajectories", trajectories)
    app.router.add_post("/v1/pause", pause)
    app.router.add_post("/v1/resume", resume)
    app.router.add_post("/v1/weights", weights)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/v1/info", info)
    app.router.add_post("/run", run)
    app.router.add_post("/aggregate_metrics", aggregate)
    app.router.add_get("/openapi.json", describe)
    return app
