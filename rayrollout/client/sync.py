"""``RolloutClient``: a trainer's handle on a running rollout service, over HTTP, blocking.

It offers what the engine actor offers a training loop (submit a batch of tasks with ``n``
samples each, its trajectories as they finish or whole, pause, resume, new weights by path,
stats, the output folder) to a process that has no Ray: a trainer on its own Python and pins.

Exactly once across the boundary: ``submit`` names its batch with an id it makes (a UUID;
pass your own to make a submit restartable across processes) and sends the same id on every
retry, so a submit whose answer was lost adds nothing the second time. ``stream`` reads the
batch's rows in cursor order and, when the connection drops, reconnects from the cursor after
the last row it yielded: no row is lost or yielded twice. As it goes it acknowledges what it
yielded, which lets the service run more of the batch (the service holds at most
``limits.max_buffered_rows`` of a batch unacknowledged: a trainer that stops reading stalls
its batch, never the service's memory). A process that dies and starts again passes the
``cursor`` it had reached (``item.cursor + 1``), kept with its own checkpoint.

Example:
    >>> from rayrollout.client import RolloutClient
    >>> token_file = "~/.rayrollout/route-tokens/rayrollout"
    >>> client = RolloutClient("http://127.0.0.1:8321", token_file=token_file)  # doctest: +SKIP
    >>> row = {"prompt": "Weather in Oslo?", "environment": "weather"}
    >>> batch = client.submit([row], n=4)  # doctest: +SKIP
    >>> for item in client.stream(batch.batch_id):  # doctest: +SKIP
    ...     print(item.trajectory.key, item.trajectory.reward)
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any

from rayrollout.auth import read_token_file
from rayrollout.client.errors import EngineGoneError, ServiceError
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

__all__ = ["RolloutClient"]

STREAM_TIMEOUT_S = 60.0  # the service sends a keepalive line every few seconds of silence


def read_token(token: str | None, token_file: str | Path | None) -> str | None:
    """The bearer token: given, or read from the file ``rayrollout up`` wrote (owner-only)."""
    if token is not None or token_file is None:
        return token
    return read_token_file(token_file)


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
    ) -> None:
        self.transport = Transport(
            url, read_token(token, token_file), timeout_s, retries, backoff_s
        )

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
    ) -> BatchStatus:
        """Queue ``n`` samples of each task row as one batch; returns it (``batch_id``).

        Raises:
            BadRequestError: a bad row (its index and field in ``errors``; nothing started
                unless ``skip_invalid``), or a bad argument.
            BatchConflictError: ``batch_id`` names a batch of other tasks.
            ServiceBusyError: the service holds its limit of open batches.
        """
        payload = {
            "batch_id": batch_id or uuid.uuid4().hex,
            "tasks": tasks,
            "n": n,
            "write": write,
            "skip_invalid": skip_invalid,
        }
        return BatchStatus.model_validate(self.transport.request("POST", "/v1/batches", payload))

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
        all acknowledged stops counting against the service's ``max_open_batches``).

        Raises:
            EngineGoneError: the service stayed unreachable, or the engine died.
            BatchConflictError: ``cursor`` is below what was already acknowledged.
        """
        acked, failures = cursor, 0
        seen: set[tuple[str, int]] = set()
        every = ack_every
        while True:
            path = f"{_batch(batch_id)}/trajectories?cursor={cursor}"
            try:
                connection, response = self.transport.open_stream(path, STREAM_TIMEOUT_S)
            except CONNECTION_ERRORS as exc:
                failures += 1
                if failures > self.transport.retries:
                    raise self.transport.gone(failures, f"{type(exc).__name__}: {exc}") from None
                self.transport.pause(failures - 1)
                continue
            acked = max(acked, cursor)  # the GET's cursor acknowledges what lies below it
            try:
                while True:
                    try:
                        line = response.readline()
                    except CONNECTION_ERRORS as exc:
                        failures += 1
                        if failures > self.transport.retries:
                            raise self.transport.gone(failures, repr(exc)) from None
                        break  # reconnect from the cursor
                    if not line.endswith(b"\n"):
                        failures += 1  # closed without its end line (or mid-line): dropped
                        if failures > self.transport.retries:
                            raise self.transport.gone(failures, "stream closed early")
                        break
                    if not line.strip():
                        continue  # keepalive
                    message = json.loads(line)
                    if "batch" in message:  # the stream's first line: the batch and limits
                        status = BatchStatus.model_validate(message["batch"])
                        every = every or max(1, status.limits.max_buffered_rows // 4)
                        failures = 0
                        continue
                    if "end" in message:
                        _end(message["end"])
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
                        self.ack(batch_id, cursor)
                        acked = cursor
            finally:
                connection.close()
            self.transport.pause(max(0, failures - 1))

    def wait(self, batch_id: str, cursor: int = 0) -> list[TrajectoryRow]:
        """The batch's rows once all are finished (in the order they finished)."""
        return [item.trajectory for item in self.stream(batch_id, cursor)]

    def generate(self, tasks: list[dict[str, Any]], n: int = 1) -> list[TrajectoryRow]:
        """Submit and wait: ``n`` samples of each task, as rows."""
        return self.wait(self.submit(tasks, n).batch_id)

    def pause(self, mode: str | None = None) -> PauseAnswer:
        """Hold new model calls; calls in flight per ``mode`` ('wait', 'abort_and_retry',
        'continue'; default the run's)."""
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
        return EngineStats.model_validate(self.transport.request("GET", "/v1/stats"))

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
