"""Coalescing calls to a stateless Serve-hosted environment: many episodes, one handle call.

A handle call costs more caller CPU than a typical tool, so a worker sends what its episodes
queue in one turn of its event loop as one ``batch`` call, never waiting on a timer; with at
most ``max_in_flight`` outstanding, batches grow under load. Stateful calls are not batched.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

__all__ = ["BatchingHandle", "run_batch"]

_MAX_BATCH = 64
_MAX_IN_FLIGHT = 4


class BatchingHandle:
    """Calls ``method(*args)`` on a deployment, coalesced into ``batch`` calls."""

    def __init__(
        self, handle: Any, max_batch: int = _MAX_BATCH, max_in_flight: int = _MAX_IN_FLIGHT
    ) -> None:
        self.handle = handle
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.waiting: list[tuple[str, tuple[Any, ...], asyncio.Future[Any]]] = []
        self.in_flight = 0
        self.scheduled = False
        self.batches = 0  # sent so far (for tests and benchmarks)
        self.calls = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def call(self, method: str, *args: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting.append((method, args, future))
        self._schedule()
        return await future

    def _schedule(self) -> None:
        if not self.scheduled and self.waiting and self.in_flight < self.max_in_flight:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._send)

    def _send(self) -> None:
        self.scheduled = False
        while self.waiting and self.in_flight < self.max_in_flight:
            batch, self.waiting = self.waiting[: self.max_batch], self.waiting[self.max_batch :]
            self.in_flight += 1
            self.batches += 1
            self.calls += len(batch)
            task = asyncio.ensure_future(self._run(batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run(self, batch: list[tuple[str, tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            outcomes = await self.handle.batch.remote([(m, a) for m, a, _ in batch])
        except BaseException as exc:  # the replica died, or the call was cancelled
            for _, _, future in batch:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            for (_, _, future), (failed, value) in zip(batch, outcomes, strict=True):
                if future.done():  # the episode gave up waiting (tool timeout)
                    continue
                if failed:
                    future.set_exception(value)
                else:
                    future.set_result(value)
        finally:
            self.in_flight -= 1
            self._schedule()


BATCHABLE = frozenset({"call_tool", "verify"})


async def run_batch(target: Any, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    """The replica's side: run every call concurrently; each outcome is (failed, value)."""
    for method, _ in calls:
        if method not in BATCHABLE:
            raise ValueError(f"'{method}' cannot be batched; only {sorted(BATCHABLE)} can")
    results = await asyncio.gather(
        *(getattr(target, method)(*args) for method, args in calls), return_exceptions=True
    )
    return [_outcome(result) for result in results]


def raised_on_replica(exc: BaseException) -> BaseException:
    """The exception the replica raised, not Ray's wrapper around it (whose text adds the
    remote traceback); ``exc`` itself when it is not wrapped."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _outcome(result: Any) -> tuple[bool, Any]:
    if not isinstance(result, BaseException):
        return False, result
    try:
        pickle.dumps(result)
    except Exception:  # an exception that cannot travel back: keep its text
        result = RuntimeError(f"{type(result).__name__}: {result}")
    return True, result
