"""The rollout service's routes as an OpenAPI 3.1 description, served at ``GET /openapi.json``.

Built from the wire models the light client owns (``rayrollout.client.models``): the same
pydantic classes the service validates requests with and builds answers from, so the
description, the server and the Python client cannot drift apart. A trainer in another
language generates its client from it (docs/how-to/service.md), and the default test tier
fuzzes every route from it (``tests/test_service_fuzz.py``).

Each route is one ``Route`` row below: its method and path, the request model (if it takes
a body), the answer model, and the statuses it may answer. Every route wants the run's
bearer token; an error answer of any route is an ``ErrorAnswer`` (``detail`` and, where one
field is at fault, ``field``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from rayrollout.api.service.bodies import MAX_CURSOR
from rayrollout.client.models import (
    BATCH_ID_PATTERN,
    AckRequest,
    AggregateMetricsRequest,
    BatchStatus,
    DeleteAnswer,
    EngineStats,
    ErrorAnswer,
    NemoGymRunRequest,
    PauseAnswer,
    PauseRequest,
    ServiceInfo,
    StreamedTrajectory,
    SubmitRequest,
    WeightsAnswer,
    WeightsRequest,
)

__all__ = ["ROUTES", "Route", "openapi"]

_REF = "#/components/schemas/{model}"
_STATUS_TEXT = {
    400: "A bad request: the field and the fix in 'detail'. Nothing was started.",
    401: "No bearer token, or not the run's.",
    404: "No such batch on this service.",
    409: "A conflict with the batch's state, named in 'detail'; nothing changed.",
    413: "The body is over the service's max_body_mb.",
    429: "The service holds max_open_batches batches; nothing was started.",
    500: "The episode failed (NeMo Gym's failure fields, _ng_failure_class and "
    "_ng_failure_message, beside 'detail').",
    503: "No engine is up: `rayrollout up --resume` starts one; retry.",
}


@dataclass(frozen=True)
class Route:
    """One route of the service, as the description states it."""

    method: str
    path: str
    summary: str
    answer: type[BaseModel] | None
    errors: tuple[int, ...]
    request: type[BaseModel] | None = None
    ok: int = 200
    extra_ok: tuple[int, ...] = ()
    stream: bool = False  # the answer is JSON lines (application/x-ndjson)
    query: tuple[dict[str, Any], ...] = field(default_factory=tuple)


_BATCH = "/v1/batches/{batch_id}"
ROUTES: tuple[Route, ...] = (
    Route(
        "post",
        "/v1/batches",
        "Submit task rows to run n times each: 201 with the new batch; 200 (created false) "
        "for a batch id the service already holds, with the same tasks.",
        BatchStatus,
        (400, 401, 404, 409, 413, 429, 503),
        request=SubmitRequest,
        ok=201,
        extra_ok=(200,),
    ),
    Route("get", _BATCH, "The batch's progress.", BatchStatus, (401, 404)),
    Route("delete", _BATCH, "Forget the batch and its rows.", DeleteAnswer, (401, 404)),
    Route(
        "post",
        f"{_BATCH}/ack",
        "The client holds every row below 'cursor': the service frees them. A cursor past "
        "the rows streamed so far is refused (409) and frees nothing.",
        BatchStatus,
        (400, 401, 404, 409, 413),
        request=AckRequest,
    ),
    Route(
        "get",
        f"{_BATCH}/trajectories",
        "The batch's rows as JSON lines from 'cursor': {\"batch\": {...}} first, then one "
        "StreamedTrajectory per row as it finishes (blank lines keep the connection alive), "
        'then {"end": {"finished", "samples", "error", "engine_gone"}}. The cursor also '
        "acknowledges the rows below it.",
        StreamedTrajectory,
        (400, 401, 404, 409),
        stream=True,
        query=(
            {
                "name": "cursor",
                "in": "query",
                "required": False,
                "description": "The cursor after the last row the client read (0: from the "
                "first row).",
                "schema": {"type": "integer", "minimum": 0, "maximum": MAX_CURSOR, "default": 0},
            },
        ),
    ),
    Route(
        "post",
        "/v1/pause",
        "Hold new model calls; calls in flight per 'mode' (default: the run's "
        "training.pause_mode).",
        PauseAnswer,
        (400, 401, 413, 503),
        request=PauseRequest,
    ),
    Route(
        "post",
        "/v1/resume",
        "Let model calls go out again, under the current version.",
        WeightsAnswer,
        (401, 503),
    ),
    Route(
        "post",
        "/v1/weights",
        "Load a checkpoint folder into the policy and move its version (pauses around the "
        "load unless paused already). The path is checked first, and a bad one is refused "
        "by name before the policy pauses.",
        WeightsAnswer,
        (400, 401, 413, 503),
        request=WeightsRequest,
    ),
    Route("get", "/v1/stats", "The engine's figures.", EngineStats, (401, 503)),
    Route(
        "get", "/v1/info", "The run behind the service, and its limits.", ServiceInfo, (401, 503)
    ),
    Route(
        "post",
        "/run",
        "NeMo Gym's agent-server call: play one NeMo Gym task row; the answer is NeMo "
        "Gym's verify response (responses_create_params, response, reward, the verifier's "
        "fields). A failed episode answers 500 with NeMo Gym's failure fields.",
        None,
        (400, 401, 413, 500, 503),
        request=NemoGymRunRequest,
    ),
    Route(
        "post",
        "/aggregate_metrics",
        "NeMo Gym's run figures of /run answers.",
        None,
        (400, 401, 413),
        request=AggregateMetricsRequest,
    ),
    Route("get", "/openapi.json", "This description.", None, (401,)),
)


def _operation(route: Route, ids: dict[str, str]) -> dict[str, Any]:
    def ref(model: type[BaseModel]) -> dict[str, Any]:
        return {"$ref": _REF.format(model=ids[model.__name__])}

    if route.stream:
        content: dict[str, Any] = {
            "application/x-ndjson": {
                "schema": {"type": "string"},
                "x-line-schema": ref(route.answer) if route.answer else {},
            }
        }
    else:
        body = ref(route.answer) if route.answer else {"type": "object"}
        content = {"application/json": {"schema": body}}
    responses: dict[str, Any] = {
        str(status): {"description": "The answer.", "content": content}
        for status in (route.ok, *route.extra_ok)
    }
    for status in route.errors:
        media = (  # aiohttp itself refuses a body over client_max_size, in plain text
            {"text/plain": {"schema": {"type": "string"}}}
            if status == 413
            else {"application/json": {"schema": ref(ErrorAnswer)}}
        )
        responses[str(status)] = {"description": _STATUS_TEXT[status], "content": media}
    operation: dict[str, Any] = {
        "operationId": _operation_id(route),
        "summary": route.summary,
        "responses": responses,
    }
    parameters = list(route.query)
    if "{batch_id}" in route.path:
        parameters.insert(
            0,
            {
                "name": "batch_id",
                "in": "path",
                "required": True,
                "description": "The batch id the submit chose.",
                "schema": {"type": "string", "pattern": BATCH_ID_PATTERN},
            },
        )
    if parameters:
        operation["parameters"] = parameters
    if route.request is not None:
        operation["requestBody"] = {
            "required": any(f.is_required() for f in route.request.model_fields.values()),
            "content": {"application/json": {"schema": ref(route.request)}},
        }
    return operation


def _operation_id(route: Route) -> str:
    words = [w.strip("{}") for w in route.path.replace(".", "/").split("/") if w and w != "v1"]
    return "_".join([route.method, *words])


def openapi() -> dict[str, Any]:
    """The service's routes as an OpenAPI 3.1 document (a JSON-ready dict)."""
    models: set[type[BaseModel]] = {ErrorAnswer}
    for route in ROUTES:
        models.update(m for m in (route.request, route.answer) if m is not None)
    ordered = sorted(models, key=lambda m: m.__name__)
    keys, definitions = models_json_schema(
        [(model, "validation") for model in ordered], ref_template=_REF
    )
    ids = {
        model.__name__: keys[(model, "validation")]["$ref"].rsplit("/", 1)[1] for model in ordered
    }
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method] = _operation(route, ids)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rayrollout rollout service",
            "version": "1",
            "description": "The rollout API over HTTP that `rayrollout up` starts beside its "
            "engine (docs/how-to/service.md). Every route wants 'Authorization: Bearer "
            "<token>': the run's token, in the file `rayrollout status` names.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
