"""The rollout service apart from HTTP; one job: a batch, from its submit to its last ack.

What the service does for each call: checks a submit
(``submit_rows``), feeds its batch to the engine within the batch's bound, frames the
stream, forwards the training-loop calls to the engine actor (``engine_link``).

The batch's samples go to the engine's ``stream`` in slices, at most ``max_buffered_rows``
of them running or finished and unacknowledged at once; rows come back as JSON lines,
framed under their cursors, each journaled before it is streamed (``journal``).

A batch whose engine died ends its streams saying so (``engine_gone``) and keeps its rows;
once ``rayrollout up --resume`` has started a new engine, a re-submit of the batch (same id,
same tasks) runs only the samples without a row (``revive``). A service started again over
the folder (``up --resume`` after it was gone too) reads a re-submitted batch back from its
journal (``reload``). For a batch that writes to the folder, the journaled rows the dead
engine had not yet put in a part are written by the new one first.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from rayrollout.api.service.batches import Batch, BatchRegistry, CursorGoneError, fingerprint
from rayrollout.api.service.engine_link import EngineLink, HttpError, died, engine_error
from rayrollout.api.service.journal import BatchJournal, JournalState, journal_root
from rayrollout.api.service.submit_rows import RowChecker
from rayrollout.client.models import (
    AckRequest,
    DeleteAnswer,
    Limits,
    PauseRequest,
    RowError,
    ServiceInfo,
    SubmitRequest,
    WeightsRequest,
)
from rayrollout.data.config import RunConfig
from rayrollout.data.schema import Task
from rayrollout.data.validation import first_problem
from rayrollout.engine.episode_spec import EpisodeSpec

__all__ = ["HttpError", "RolloutService", "engine_error", "limits_of"]

SLICE = 1024  # samples per engine.stream call: one Ray call, fewer items, for many episodes
KEEPALIVE_S = 5.0  # a silent stream sends an empty line this often (dead peers show)
_WEIGHT_ANSWERS = 256  # update_weights answers kept by request id, for retried requests
_DEAD_FEEDER_S = 30.0  # how long a revival waits for the dead engine's calls to fail


def limits_of(config: RunConfig) -> Limits:
    """The service's limits a client reads (``/v1/info``): the settings of the same names."""
    return Limits(**config.service.model_dump(include=set(Limits.model_fields)))


def _invalid(exc: ValidationError, prefix: str = "") -> HttpError:
    """A request model's validation error as a 400 naming the field."""
    field, problem, _ = first_problem(exc)
    return HttpError(400, f"field '{prefix + field}': {problem}", field=prefix + field)


class RolloutService:
    """The service's state: the engine, the batches, answers kept for retries."""

    def __init__(self, config: RunConfig, engine: Any) -> None:
        self.config = config
        self.link = EngineLink(config, engine)
        self.rows = RowChecker(config)
        self.journals = journal_root(config.output.dir)
        self.limits = limits_of(config)
        self.registry = BatchRegistry(config.service.max_open_batches, config.service.retain_s)
        self.submitting: dict[str, asyncio.Future[None]] = {}
        self.weight_answers: OrderedDict[str, asyncio.Future[dict[str, Any]]] = OrderedDict()

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
        self.submitting[request.batch_id] = asyncio.get_running_loop().create_future()
        try:
            return await self._submit(request, digest)
        finally:
            self.submitting.pop(request.batch_id).set_result(None)

    async def _submit(self, request: SubmitRequest, digest: str) -> tuple[int, dict[str, Any]]:
        known = self.registry.known(request.batch_id)
        if known is not None:
            _same(request.batch_id, known.digest, digest)
            if known.engine_gone and not known.deleted:
                await self.revive(known)
            return 200, known.status(created=False)
        loaded = await asyncio.to_thread(BatchJournal.load, self.journals, request.batch_id)
        if loaded is not None:
            _same(request.batch_id, loaded[1].meta.get("digest"), digest)
            self._room_for_a_batch()
            batch = await self.reload(request, *loaded)
            return 200, batch.status(created=False)
        if request.resubmit:
            raise HttpError(
                404,
                f"no batch {request.batch_id!r} to resume: this service holds it neither in "
                f"memory nor in a journal under {self.journals} (deleted, settled, or the "
                "service started over another folder); nothing was started",
            )
        self._room_for_a_batch()
        batch = await self._new_batch(request, digest)
        return 201, batch.status(created=True)

    def _room_for_a_batch(self) -> None:
        if self.registry.open_count() >= self.limits.max_open_batches:
            raise HttpError(
                429,
                f"the service holds max_open_batches={self.limits.max_open_batches} batches "
                "with work left or rows unacknowledged: read (or DELETE) one first",
            )

    async def _tasks(self, request: SubmitRequest) -> tuple[list[Task], list[RowError]]:
        """The submit's rows as tasks: a bad row refuses it whole unless ``skip_invalid``."""
        return await asyncio.to_thread(self.rows.tasks, request.tasks, request.skip_invalid)

    async def _new_batch(self, request: SubmitRequest, digest: str) -> Batch:
        tasks, rejected = await self._tasks(request)
        write = self.config.training.write_trajectories if request.write is None else request.write
        first_index: dict[str, int] = {}
        if write and tasks:
            counts = {task.task_id: request.n for task in tasks}
            first_index = await self.link.call("reserve_samples", counts)
        meta = {
            "batch_id": request.batch_id,
            "digest": digest,
            "n": request.n,
            "write": write,
            "first_index": first_index,
        }
        try:
            journal = await asyncio.to_thread(
                BatchJournal.create, self.journals, request.batch_id, meta
            )
        except OSError as exc:
            raise HttpError(
                500, f"cannot keep the batch's journal under {self.journals}: {exc}"
            ) from None
        batch = self._batch_of(request, tasks, rejected, meta, journal)
        batch.feeder = asyncio.create_task(self._feed(batch))
        return batch

    def _batch_of(
        self,
        request: SubmitRequest,
        tasks: list[Task],
        rejected: list[RowError],
        meta: dict[str, Any],
        journal: BatchJournal,
    ) -> Batch:
        first_index: dict[str, int] = meta["first_index"]
        specs = [
            EpisodeSpec(task, first_index.get(task.task_id, 0) + k)
            for task in tasks
            for k in range(request.n)
        ]
        batch = Batch(
            request.batch_id,
            specs,
            len(tasks),
            request.n,
            bool(meta["write"]),
            meta["digest"],
            rejected,
            self.limits,
            journal,
        )
        self.registry.add(batch)
        return batch

    async def reload(
        self, request: SubmitRequest, journal: BatchJournal, state: JournalState
    ) -> Batch:
        """A batch of a service now gone, read back from its journal: its rows keep their
        cursors; what has no row runs (on the engine, which first claims its samples)."""
        tasks, rejected = await self._tasks(request)
        await self.link.current()  # 503 while no engine is up: nothing loaded yet
        keys = await asyncio.to_thread(state.keys)
        if state.meta.get("write"):
            await self.link.restore(state)
        batch = self._batch_of(request, tasks, rejected, state.meta, journal)
        batch.load(state.lines, keys, state.acked)
        batch.feeder = asyncio.create_task(self._feed(batch))
        return batch

    async def revive(self, batch: Batch) -> None:
        """A batch whose engine died, re-submitted: on the new engine, once it is up, the
        samples without a row run again (the rows the client has, or may still read, stay)."""
        if batch.feeder is not None:  # the dead engine's calls: each fails in a moment
            await asyncio.wait({batch.feeder}, timeout=_DEAD_FEEDER_S)
        await self.link.current()
        if batch.write and batch.journal is not None:
            loaded = await asyncio.to_thread(BatchJournal.load, self.journals, batch.batch_id)
            if loaded is not None:
                await self.link.restore(loaded[1])
        batch.revive()
        batch.feeder = asyncio.create_task(self._feed(batch))

    async def _feed(self, batch: Batch) -> None:
        """Send the batch's samples to the engine while it has room (backpressure)."""
        running: set[asyncio.Task[None]] = set()
        generation = batch.generation
        while batch.unsent and batch.error is None and batch.generation == generation:
            if batch.room <= 0:
                await batch.changed(KEEPALIVE_S)
                continue
            take = min(batch.room, SLICE, len(batch.unsent))
            specs = [batch.unsent.popleft() for _ in range(take)]
            batch.sent += take
            call = asyncio.create_task(self._run_slice(batch, specs, generation))
            running.add(call)
            call.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)

    async def _run_slice(self, batch: Batch, specs: list[EpisodeSpec], generation: int) -> None:
        try:
            engine = await self.link.current()
        except HttpError as exc:
            batch.fail(exc.body["detail"], engine_gone=True, generation=generation)
            return
        try:
            async for ref in engine.stream.remote(specs, batch.write):
                rows = await ref
                if not batch.deleted:
                    batch.add(rows)
        except Exception as exc:
            self.link.lost(engine, exc)
            if not died(exc):
                batch.fail(
                    f"the engine failed the batch: {type(exc).__name__}: {exc}",
                    generation=generation,
                )
                return
            batch.fail(
                f"the engine actor died ({type(exc).__name__}): once `rayrollout up --resume` "
                "has started a new one, a re-submit of the batch runs the samples without a "
                "row",
                engine_gone=True,
                generation=generation,
            )

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
        """Free the rows below the body's cursor; refused (409, nothing freed) past the
        rows streamed so far: rows nobody read are never dropped."""
        try:
            request = AckRequest.model_validate(body)
        except ValidationError as exc:
            raise _invalid(exc) from None
        batch = self.batch(batch_id)
        if request.cursor > batch.streamed:
            raise HttpError(
                409,
                f"field 'cursor': {request.cursor} is past the {batch.streamed} rows batch "
                f"{batch_id!r} has streamed so far ({batch.finished} finished): acknowledge "
                "only rows you read (the last one's cursor + 1). Nothing was freed",
                field="cursor",
            )
        batch.acknowledge(request.cursor)
        return batch.status()

    def delete(self, batch_id: str) -> dict[str, Any]:
        batch = self.batch(batch_id)
        self.registry.delete(batch)
        return DeleteAnswer(batch_id=batch_id, deleted=True).model_dump(mode="json")

    def open_stream(self, batch_id: str, cursor: int) -> AsyncIterator[bytes]:
        """The stream's lines from ``cursor`` (checked now, so a bad cursor is a 409 before
        the stream starts): the batch, then rows as they finish, then the end."""
        batch = self.batch(batch_id)
        if cursor > batch.finished:
            raise HttpError(
                409,
                f"query 'cursor': {cursor} of batch {batch_id!r} is past its {batch.finished} "
                "finished rows: a cursor comes from a row this batch streamed (its cursor + 1)",
                field="cursor",
            )
        try:
            batch.lines_from(cursor)
        except CursorGoneError as exc:
            raise HttpError(409, str(exc)) from None
        batch.reached(cursor)  # the client holds the rows below its cursor
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
                batch.reached(cursor)  # handed to the stream: the client may ack them now
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
        return await self.link.call(method, *args)

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
        answer = ServiceInfo(
            namespace=self.config.namespace,
            run_id=info.get("run_id"),
            output_dir=info["output_dir"],
            output_format=info["output_format"],
            policy_version=snapshot.policy.version,
            open_batches=self.registry.open_count(),
            limits=self.limits,
        )
        return answer.model_dump(mode="json")

    async def close(self) -> None:
        """Stop feeding; the journals stay, for a service started again with ``--resume``."""
        for batch in self.registry.batches.values():
            if batch.feeder is not None:
                batch.feeder.cancel()
            if batch.journal is not None:
                batch.journal.close()


def _same(batch_id: str, known: Any, digest: str) -> None:
    """A known batch id re-submitted: with the same tasks, or refused (409)."""
    if known != digest:
        raise HttpError(
            409,
            f"batch id {batch_id!r} was submitted with other tasks: a retry sends the same "
            "tasks, a new batch takes a new id",
        )
