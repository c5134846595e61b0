"""``RolloutClient``: a trainer's handle on a running rollout service, over HTTP, blocking.

What the engine actor offers a training loop, for a process without Ray. Exactly once across
the boundary: ``submit`` sends one batch id on every retry, and ``stream`` reconnects from
its cursor, acknowledging as it goes (a trainer that stops reading stalls its batch, never
the service). An engine that dies under a batch is ridden out for ``restart_wait_s``.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections import OrderedDict
from collections.abc import Generator
from pathlib import Path
from typing import Any, TypedDict

from rayrollout.auth import read_token_file
from rayrollout.client.errors import BatchNotFoundError, EngineGoneError, ServiceError
from rayrollout.client.models import (
    BatchStatus,
    EngineStats,
    PauseAnswer,
    ServiceInfo,
    StreamedTrajectory,
    TrajectoryRow,
    WeightsAnswer,
)
from rayrollout.client.transport import CONNECTION_ERRORS, Transport

__all__ = ["ClientOptions", "RolloutClient", "SubmitOptions"]

STREAM_TIMEOUT_S = 60.0  # the service sends a keepalive line every few seconds of silence
_SUBMITS_KEPT = 256  # submits remembered, to send again after an engine restart


def read_token(token: str | None, token_file: str | Path | None) -> str | None:
    """The bearer token: given, or read from the file ``rayrollout up`` wrote (owner-only)."""
    if token is not None or token_file is None:
        return token
    return read_token_file(token_file)


class ClientOptions(TypedDict, total=False):
    """``RolloutClient``'s keyword arguments (``AsyncRolloutClient`` takes the same)."""

    token_file: str | Path | None
    timeout_s: float
    retries: int
    backoff_s: float
    restart_wait_s: float


class SubmitOptions(TypedDict, total=False):
    """``RolloutClient.submit``'s keyword arguments (``AsyncRolloutClient.submit``'s too)."""

    batch_id: str | None
    write: bool | None
    skip_invalid: bool
    resubmit: bool


class RolloutClient:
    """Blocking client of the rollout service (``AsyncRolloutClient`` is its async form).

    Args:
        url: The service, as ``rayrollout status`` prints it (``http://127.0.0.1:8321``).
        token: The run's bearer token; or ``token_file``, the file holding it.
        timeout_s: Seconds one request may take (a stream waits ``STREAM_TIMEOUT_S``
            between lines).
        retries: Tries after the first when the connection fails or the service answers
            502-504; then ``EngineGoneError``.
        backoff_s: First pause between tries, doubling (at most 5 s).
        restart_wait_s: How long a stream of a batch this client submitted waits for its
            engine (or service) to come back after it died, sending the batch again, before
            it raises ``EngineGoneError``; 0: raise at once.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        token_file: str | Path | None = None,
        timeout_s: float = 60.0,
        retries: int = 6,
        backoff_s: float = 0.2,
        restart_wait_s: float = 120.0,
    ) -> None:
        self.transport = Transport(
            url, read_token(token, token_file), timeout_s, retries, backoff_s
        )
        self.restart_wait_s = restart_wait_s
        self.submitted: OrderedDict[str, dict[str, Any]] = OrderedDict()  # by batch id

    @property
    def url(self) -> str:
        return self.transport.url

    def submit(
        self,
        tasks: list[dict[str, Any]],
        n: int = 1,
        *,
        batch_id: str | None = None,
        write: bool | None = None,
        skip_invalid: bool = False,
        resubmit: bool = False,
    ) -> BatchStatus:
        """Queue ``n`` samples of each task row as one batch; returns it (``batch_id``).

        Sent again with the same ``batch_id`` and tasks, it adds nothing (``created`` is
        False): a batch whose engine died is finished by the service's new engine, the
        rows it had kept answered as they were. ``resubmit=True`` says this process already
        holds rows of the batch (a trainer restarted from its checkpoint): a service that
        no longer knows the batch then refuses it (404) instead of starting it anew.

        Raises:
            BadRequestError: a bad row (its index and field in ``errors``; nothing started
                unless ``skip_invalid``), or a bad argument.
            BatchConflictError: ``batch_id`` names a batch of other tasks.
            BatchNotFoundError: ``resubmit`` and the service no longer knows the batch.
            ServiceBusyError: the service holds its limit of open batches.
        """
        batch_id = batch_id or uuid.uuid4().hex
        payload: dict[str, Any] = {
            "batch_id": batch_id,
            "tasks": tasks,
            "n": n,
            "write": write,
            "skip_invalid": skip_invalid,
        }
        self.submitted[batch_id] = payload
        self.submitted.move_to_end(batch_id)
        while len(self.submitted) > _SUBMITS_KEPT:
            self.submitted.popitem(last=False)
        answer = self.transport.request("POST", "/v1/batches", {**payload, "resubmit": resubmit})
        return BatchStatus.model_validate(answer)

    def batch(self, batch_id: str) -> BatchStatus:
        """How far a batch got."""
        return BatchStatus.model_validate(self.transport.request("GET", _batch(batch_id)))

    def ack(self, batch_id: str, cursor: int) -> BatchStatus:
        """Tell the service every row below ``cursor`` is consumed (it frees them)."""
        path = f"{_batch(batch_id)}/ack"
        return BatchStatus.model_validate(self.transport.request("POST", path, {"cursor": cursor}))

    def delete(self, batch_id: str) -> None:
        """Forget a batch (its unfinished samples still run out, unread)."""
        self.transport.request("DELETE", _batch(batch_id))

    def stream(
        self, batch_id: str, cursor: int = 0, ack_every: int | None = None
    ) -> Generator[StreamedTrajectory, None, None]:
        """The batch's rows from ``cursor`` on, as they finish, until the batch is done.

        Reconnects from where it stood when the connection drops; acknowledges what it
        yielded every ``ack_every`` rows (default: a quarter of the service's
        ``max_buffered_rows``), when it reconnects, and at the end (a batch whose rows are
        all acknowledged stops counting against the service's ``max_open_batches``). When
        the engine (or the service) dies under a batch this client submitted, it sends the
        batch again until a new one is up, for at most ``restart_wait_s``, and goes on from
        its cursor: each ``(task_id, sample_index)`` is yielded once.

        Raises:
            EngineGoneError: the service stayed unreachable, or the engine died and no new
                one came up in time (at once for a batch this client did not submit).
            BatchConflictError: ``cursor`` is below what was already acknowledged.
            BatchNotFoundError: the service does not know the batch (after a restart: it
                kept no journal of it).
        """
        acked, failures = cursor, 0
        seen: set[tuple[str, int]] = set()
        every = ack_every
        outage: float | None = None  # when the service or its engine was first found gone
        sent_again = False  # the batch was sent again since the last stream that opened
        while True:
            path = f"{_batch(batch_id)}/trajectories?cursor={cursor}"
            try:
                connection, response = self.transport.open_stream(path, STREAM_TIMEOUT_S)
            except CONNECTION_ERRORS as exc:
                failures += 1
                if failures > self.transport.retries:
                    cause = f"{type(exc).__name__}: {exc}"
                    outage = self._send_again(batch_id, cursor, outage, failures, cause)
                    sent_again, failures = True, 0
                    continue
                self.transport.pause(failures - 1)
                continue
            except BatchNotFoundError:  # a service started again: it reads the batch back
                if sent_again or batch_id not in self.submitted:
                    raise
                outage = self._send_again(batch_id, cursor, outage, failures, "404")
                sent_again = True
                continue
            acked = max(acked, cursor)  # the GET's cursor acknowledges what lies below it
            try:
                while True:
                    try:
                        line = response.readline()
                    except CONNECTION_ERRORS as exc:
                        failures += 1
                        if failures > self.transport.retries:
                            outage = self._send_again(batch_id, cursor, outage, failures, repr(exc))
                            sent_again, failures = True, 0
                        break  # reconnect from the cursor
                    if not line.endswith(b"\n"):
                        failures += 1  # closed without its end line (or mid-line): dropped
                        if failures > self.transport.retries:
                            cause = "stream closed early"
                            outage = self._send_again(batch_id, cursor, outage, failures, cause)
                            sent_again, failures = True, 0
                        break
                    if not line.strip():
                        continue  # keepalive
                    message = json.loads(line)
                    if "batch" in message:  # the stream's first line: the batch and limits
                        status = BatchStatus.model_validate(message["batch"])
                        every = every or max(1, status.limits.max_buffered_rows // 4)
                        failures, sent_again = 0, False
                        if not status.engine_gone:
                            outage = None
                        continue
                    if "end" in message:
                        end = message["end"]
                        if end.get("engine_gone") and batch_id in self.submitted:
                            cause = str(end.get("error"))
                            outage = self._send_again(batch_id, cursor, outage, 0, cause)
                            sent_again = True
                            break  # the batch goes on, on the new engine
                        _end(end)
                        if cursor > acked:  # the rest is consumed too: the batch settles
                            self.ack(batch_id, cursor)
                        return
                    item = StreamedTrajectory.model_validate(message)
                    cursor = item.cursor + 1
                    if item.trajectory.key in seen:
                        continue  # never sent twice by the service; a guard all the same
                    seen.add(item.trajectory.key)
                    yield item
                    if every and cursor - acked >= every:
                        try:
                            self.ack(batch_id, cursor)
                        except (EngineGoneError, BatchNotFoundError):
                            break  # the service went away: the reconnect's GET acknowledges
                        acked = cursor
            finally:
                connection.close()
            self.transport.pause(max(0, failures - 1))

    def _send_again(
        self, batch_id: str, cursor: int, outage: float | None, tries: int, cause: str
    ) -> float:
        """The batch's service or engine is gone: send the batch again (the service answers
        it once a new engine is up) until ``restart_wait_s`` has passed since ``outage``
        began; returns when that began.

        Raises:
            EngineGoneError: the batch is not this client's to send again, or the time ran
                out.
        """
        payload = self.submitted.get(batch_id)
        if payload is None or self.restart_wait_s <= 0:
            if tries:
                raise self.transport.gone(tries, cause)
            raise EngineGoneError(f"the batch cannot finish: {cause}")
        began = time.monotonic() if outage is None else outage
        while True:
            try:
                self.transport.request("POST", "/v1/batches", {**payload, "resubmit": cursor > 0})
                return began
            except EngineGoneError as exc:
                if time.monotonic() - began >= self.restart_wait_s:
                    raise EngineGoneError(
                        f"batch {batch_id!r}: no engine came back in restart_wait_s="
                        f"{self.restart_wait_s:g} ({cause}; then {exc})"
                    ) from None
                time.sleep(1.0)

    def wait(self, batch_id: str, cursor: int = 0) -> list[TrajectoryRow]:
        """The batch's rows once all are finished (in the order they finished)."""
        return [item.trajectory for item in self.stream(batch_id, cursor)]

    def generate(self, tasks: list[dict[str, Any]], n: int = 1) -> list[TrajectoryRow]:
        """Submit and wait: ``n`` samples of each task, as rows."""
        return self.wait(self.submit(tasks, n).batch_id)

    def pause(self, mode: str | None = None) -> PauseAnswer:
        """Hold new model calls; calls in flight per ``mode`` ('wait', 'abort_and_retry',
        'continue', 'interrupt'; default the run's)."""
        answer = self.transport.request("POST", "/v1/pause", {"mode": mode})
        return PauseAnswer.model_validate(answer)

    def resume(self) -> WeightsAnswer:
        """Let model calls go out again, under the current policy version."""
        return WeightsAnswer.model_validate(self.transport.request("POST", "/v1/resume", {}))

    def update_weights(self, path: str | None = None, version: int | None = None) -> WeightsAnswer:
        """Load a checkpoint folder (absolute path on the engine's machines, safetensors) into
        the policy; returns the new version. Retried safely: the request carries an id."""
        payload = {"path": path, "version": version, "request_id": uuid.uuid4().hex}
        return WeightsAnswer.model_validate(self.transport.request("POST", "/v1/weights", payload))

    def stats(self) -> EngineStats:
        """The engine's figures: episodes, throughput, errors, policy version and pause."""
        return EngineStats.from_answer(self.transport.request("GET", "/v1/stats"))

    def info(self) -> ServiceInfo:
        """The run behind the service: namespace, output folder, limits."""
        return ServiceInfo.model_validate(self.transport.request("GET", "/v1/info"))

    def output_dir(self) -> str:
        """The run's output folder (on the engine's machine)."""
        return self.info().output_dir

    def run(self, row: dict[str, Any]) -> dict[str, Any]:
        """NeMo Gym's agent-server call: one task row in, its verified response out."""
        return self.transport.request("POST", "/run", row)


def _batch(batch_id: str) -> str:
    return f"/v1/batches/{urllib.parse.quote(batch_id, safe='')}"


def _end(end: dict[str, Any]) -> None:
    """The stream's last line: raise what stopped the batch, if anything did."""
    error = end.get("error")
    if error:
        if end.get("engine_gone"):
            raise EngineGoneError(f"the batch cannot finish: {error}")
        raise ServiceError(500, str(error), end)
