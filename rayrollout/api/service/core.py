"""What the rollout service does for each call, apart from HTTP: checks a submit, feeds its
batch to the engine within the batch's bound, frames the stream, forwards the training-loop
calls to the engine actor.

A submit is checked whole before anything runs: every row parsed as a task file row (the
same ``parse_task_row`` as ``collect``), ids unique, environments and agents known; a bad row
is a 400 naming its index in ``tasks`` and its field, nothing started (or, with
``skip_invalid``, the rest runs and the answer lists it). The batch's samples go to the
engine's ``stream`` in slices, at most ``max_buffered_rows`` of them running or finished
and unacknowledged at once; rows come back as JSON lines, framed under their cursors.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from rayrollout.api.preflight import check_agent, environment_known
from rayrollout.api.service.batches import Batch, BatchRegistry, CursorGoneError, fingerprint
from rayrollout.client.models import (
    Limits,
    PauseRequest,
    RowError,
    SubmitRequest,
    WeightsRequest,
)
from rayrollout.data.config import RunConfig
from rayrollout.data.schema import Task
from rayrollout.data.tasks import InvalidTaskError, UniqueTaskIds, parse_task_row
from rayrollout.engine.episode import EpisodeSpec
from rayrollout.errors import InputError, RayrolloutError

__all__ = ["HttpError", "RolloutService", "limits_of"]

SLICE = 1024  # samples per engine.stream call: one Ray call, fewer items, for many episodes
KEEPALIVE_S = 5.0  # a silent stream sends an empty line this often (dead peers show)
_WEIGHT_ANSWERS = 256  # update_weights answers kept by request id, for retried requests


class HttpError(RayrolloutError, RuntimeError):
    """A call the service refuses: its HTTP status and a JSON body with ``detail``."""

    def __init__(self, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.body = status, {"detail": detail, **extra}


def limits_of(config: RunConfig) -> Limits:
    s = config.service
    return Limits(
        max_buffered_rows=s.max_buffered_rows,
        max_open_batches=s.max_open_batches,
        max_tasks_per_submit=s.max_tasks_per_submit,
        max_samples_per_task=s.max_samples_per_task,
        max_body_mb=s.max_body_mb,
    )


def _invalid(exc: ValidationError, prefix: str = "") -> HttpError:
    """A request model's validation error as a 400 naming the field."""
    first = exc.errors()[0]
    field = prefix + ".".join(str(p) for p in first["loc"])
    return HttpError(400, f"field '{field}': {first['msg']}", field=field)


def engine_error(exc: BaseException) -> HttpError:
    """An engine call's failure: its own refusal (400/500 with its message), or 503 gone."""
    if isinstance(exc, RayActorError | ActorUnavailableError):
        return HttpError(503, f"the engine actor is gone ({type(exc).__name__}): `rayrollout up`")
    cause = exc.cause if isinstance(exc, RayTaskError) else exc
    status = 400 if isinstance(cause, ValueError | InputError) else 500
    return HttpError(status, f"{type(cause).__name__}: {cause}")


class RolloutService:
    """The service's state: the engine's handle, the batches, answers kept for retries."""

    def __init__(self, config: RunConfig, engine: Any) -> None:
        self.config, self.engine = config, engine
        self.limits = limits_of(config)
        self.registry = BatchRegistry(config.service.max_open_batches, config.service.retain_s)
        self.submitting: dict[str, asyncio.Future[None]] = {}
        self.weight_answers: OrderedDict[str, asyncio.Future[dict[str, Any]]] = OrderedDict()
        self.known_names: dict[tuple[str, str], str | None] = {}  # (kind, name) -> problem

    # Batches.

    async def submit(self, body: Any) -> tuple[int, dict[str, Any]]:
        """A new batch (201), or the one a retried submit names (200, created false)."""
        try:
            request = SubmitRequest.model_validate(body)
        except ValidationError as exc:
            raise _invalid(exc) from None
        if len(request.tasks) > self.limits.max_tasks_per_submit:
            raise HttpError(
                400,
                f"field 'tasks': {len(request.tasks)} rows, over the service's "
                f"max_tasks_per_submit={self.limits.max_tasks_per_submit}: split the batch",
                field="tasks",
            )
        if request.n > self.limits.max_samples_per_task:
            raise HttpError(
                400,
                f"field 'n': {request.n}, over max_samples_per_task="
                f"{self.limits.max_samples_per_task}",
                field="n",
            )
        while request.batch_id in self.submitting:  # the same submit, sent again meanwhile
            await asyncio.shield(self.submitting[request.batch_id])
        digest = fingerprint(request.tasks, request.n, request.write)
        known = self.registry.known(request.batch_id)
        if known is not None:
            if known.digest != digest:
                raise HttpError(
                    409,
                    f"batch id {request.batch_id!r} was submitted with other tasks: a retry "
                    "sends the same tasks, a new batch takes a new id",
                )
            return 200, known.status(created=False)
        if self.registry.open_count() >= self.limits.max_open_batches:
            raise HttpError(
                429,
                f"the service holds max_open_batches={self.limits.max_open_batches} batches "
                "with work left or rows unacknowledged: read (or DELETE) one first",
            )
        self.submitting[request.batch_id] = asyncio.get_running_loop().create_future()
        try:
            batch = await self._new_batch(request, digest)
        finally:
            self.submitting.pop(request.batch_id).set_result(None)
        return 201, batch.status(created=True)

    async def _new_batch(self, request: SubmitRequest, digest: str) -> Batch:
        tasks, rejected = await asyncio.to_thread(self._parse, request.tasks)
        if rejected and not request.skip_invalid:
            first = rejected[0]
            more = f"; {len(rejected) - 1} more bad rows in 'errors'" if len(rejected) > 1 else ""
            raise HttpError(
                400,
                f"{_where(first)}: {first.message}{more}. Nothing was started",
                errors=[r.model_dump() for r in rejected],
            )
        write = self.config.training.write_trajectories if request.write is None else request.write
        first_index: dict[str, int] = {}
        if write and tasks:
            counts = {task.task_id: request.n for task in tasks}
            try:
                first_index = await self.engine.reserve_samples.remote(counts)
            except Exception as exc:
                raise engine_error(exc) from None
        specs = [
            EpisodeSpec(task, first_index.get(task.task_id, 0) + k)
            for task in tasks
            for k in range(request.n)
        ]
        batch = Batch(
            request.batch_id, specs, len(tasks), request.n, write, digest, rejected, self.limits
        )
        self.registry.add(batch)
        batch.feeder = asyncio.create_task(self._feed(batch))
        return batch

    def _parse(self, rows: list[dict[str, Any]]) -> tuple[list[Task], list[RowError]]:
        """The rows as tasks, and the rows refused (index, field, message)."""
        tasks: list[Task] = []
        rejected: list[RowError] = []
        unique = UniqueTaskIds()
        for index, row in enumerate(rows):
            raw_id = row.get("task_id") if isinstance(row, dict) else None
            try:
                task = parse_task_row(
                    row, default_environment=self.config.environment, source="tasks", line=index
                )
                unique.check(task, "tasks", index)
                field, problem = self._names_problem(task)
                if problem is not None:
                    raise InvalidTaskError("tasks", index, field, problem)
            except InvalidTaskError as exc:
                task_id = raw_id if isinstance(raw_id, str | int) else None
                rejected.append(
                    RowError(
                        row=index,
                        task_id=None if task_id is None else str(task_id),
                        field=exc.field,
                        message=exc.message.replace(" line ", " row "),
                    )
                )
                continue
            tasks.append(task)
        return tasks, rejected

    def _names_problem(self, task: Task) -> tuple[str, str | None]:
        """Whether the task's environment and agent exist (each name checked once)."""
        for kind, name in (("environment", task.environment), ("agent", task.agent)):
            if name is None:
                continue
            if (kind, name) not in self.known_names:
                self.known_names[(kind, name)] = self._name_problem(kind, name)
            problem = self.known_names[(kind, name)]
            if problem is not None:
                return kind, problem
        return "", None

    def _name_problem(self, kind: str, name: str) -> str | None:
        if kind == "environment":
            known = environment_known(name, self.config)
            return None if known else f"unknown environment {name!r}"
        try:
            check_agent(name, self.config, "the row")
        except InputError as exc:
            return str(exc)
        return None

    async def _feed(self, batch: Batch) -> None:
        """Send the batch's samples to the engine while it has room (backpressure)."""
        running: set[asyncio.Task[None]] = set()
        while batch.unsent and batch.error is None:
            if batch.room <= 0:
                await batch.changed(KEEPALIVE_S)
                continue
            take = min(batch.room, SLICE, len(batch.unsent))
            specs = [batch.unsent.popleft() for _ in range(take)]
            batch.sent += take
            call = asyncio.create_task(self._run_slice(batch, specs))
            running.add(call)
            call.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)

    async def _run_slice(self, batch: Batch, specs: list[EpisodeSpec]) -> None:
        try:
            async for ref in self.engine.stream.remote(specs, batch.write):
                rows = await ref
                if not batch.deleted:
                    batch.add(rows)
        except (RayActorError, ActorUnavailableError) as exc:
            batch.fail(f"the engine actor died ({type(exc).__name__})", engine_gone=True)
        except Exception as exc:
            batch.fail(f"the engine failed the batch: {type(exc).__name__}: {exc}")

    def batch(self, batch_id: str) -> Batch:
        batch = self.registry.get(batch_id)
        if batch is None:
            raise HttpError(
                404,
                f"no batch {batch_id!r} on this service (never submitted, deleted, or the "
                "service restarted): submit it again",
            )
        return batch

    def acknowledge(self, batch_id: str, body: Any) -> dict[str, Any]:
        batch = self.batch(batch_id)
        cursor = body.get("cursor") if isinstance(body, dict) else None
        if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
            raise HttpError(400, "field 'cursor': a non-negative integer", field="cursor")
        batch.acknowledge(cursor)
        return batch.status()

    def delete(self, batch_id: str) -> dict[str, Any]:
        batch = self.batch(batch_id)
        self.registry.delete(batch)
        return {"batch_id": batch_id, "deleted": True}

    def open_stream(self, batch_id: str, cursor: int) -> AsyncIterator[bytes]:
        """The stream's lines from ``cursor`` (checked now, so a bad cursor is a 409 before
        the stream starts): the batch, then rows as they finish, then the end."""
        batch = self.batch(batch_id)
        try:
            batch.lines_from(cursor)
        except CursorGoneError as exc:
            raise HttpError(409, str(exc)) from None
        if cursor > batch.finished:
            raise HttpError(
                409,
                f"cursor {cursor} of batch {batch_id!r} is past its {batch.finished} finished "
                "rows: a cursor comes from a row this batch streamed (its cursor + 1)",
            )
        batch.acknowledge(cursor)
        return self._lines(batch, cursor)

    async def _lines(self, batch: Batch, cursor: int) -> AsyncIterator[bytes]:
        yield b'{"batch":%s}\n' % json.dumps(batch.status()).encode()
        while True:
            try:
                lines = batch.lines_from(cursor)
            except CursorGoneError:  # another reader acknowledged past us
                lines = []
                cursor = batch.acknowledged
            if lines:
                cursor += len(lines)
                yield b"".join(lines)
                continue
            if batch.over and cursor >= batch.finished:
                end = {
                    "finished": batch.finished,
                    "samples": batch.samples,
                    "error": batch.error,
                    "engine_gone": batch.engine_gone,
                }
                yield b'{"end":%s}\n' % json.dumps(end).encode()
                return
            before = (batch.finished, batch.error)
            await batch.changed(KEEPALIVE_S)
            if (batch.finished, batch.error) == before:
                yield b"\n"

    # The training loop's calls, forwarded to the engine actor.

    async def call_engine(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self.engine, method).remote(*args)
        except Exception as exc:
            raise engine_error(exc) from None

    async def pause(self, body: Any) -> dict[str, Any]:
        try:
            request = PauseRequest.model_validate(body or {})
        except ValidationError as exc:
            raise _invalid(exc) from None
        answer: dict[str, Any] = await self.call_engine("pause", request.mode)
        return answer

    async def update_weights(self, body: Any) -> dict[str, Any]:
        try:
            request = WeightsRequest.model_validate(body or {})
        except ValidationError as exc:
            raise _invalid(exc) from None
        if request.request_id is None:
            answer: dict[str, Any] = await self.call_engine(
                "update_weights", request.path, request.version
            )
            return answer
        future = self.weight_answers.get(request.request_id)
        if future is None:  # the first time this request id is seen: make the update
            future = asyncio.ensure_future(
                self.call_engine("update_weights", request.path, request.version)
            )
            self.weight_answers[request.request_id] = future
            while len(self.weight_answers) > _WEIGHT_ANSWERS:
                self.weight_answers.popitem(last=False)
        try:
            return await asyncio.shield(future)
        except HttpError:
            self.weight_answers.pop(request.request_id, None)  # a refused update may be retried
            raise

    async def stats(self) -> dict[str, Any]:
        stats = await self.call_engine("stats")
        answer: dict[str, Any] = stats.model_dump(mode="json")
        return answer

    async def info(self) -> dict[str, Any]:
        info = await self.call_engine("info")
        snapshot = await self.call_engine("stats_snapshot")
        return {
            "namespace": self.config.namespace,
            "run_id": info.get("run_id"),
            "output_dir": info["output_dir"],
            "output_format": info["output_format"],
            "policy_version": snapshot.policy.version,
            "open_batches": self.registry.open_count(),
            "limits": self.limits.model_dump(),
        }

    async def close(self) -> None:
        for batch in self.registry.batches.values():
            if batch.feeder is not None:
                batch.feeder.cancel()


def _where(error: RowError) -> str:
    named = f" (task_id {error.task_id!r})" if error.task_id is not None else ""
    field = f", field '{error.field}'" if error.field else ""
    return f"tasks[{error.row}]{named}{field}"
