"""``AsyncRolloutClient``: the blocking client's calls as coroutines, for trainers on asyncio.

One implementation, two forms: each call runs the blocking client's in a worker thread
(``asyncio.to_thread``), so retries, idempotency keys, cursors and errors are the same code,
and the event loop never waits on a socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rayrollout.client.models import (
    BatchStatus,
    EngineStats,
    PauseAnswer,
    ServiceInfo,
    StreamedTrajectory,
    TrajectoryRow,
    WeightsAnswer,
)
from rayrollout.client.sync import RolloutClient

__all__ = ["AsyncRolloutClient"]

_DONE = object()


class AsyncRolloutClient:
    """The rollout service's client for asyncio; arguments as ``RolloutClient``'s."""

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
        self.sync = RolloutClient(
            url,
            token,
            token_file=token_file,
            timeout_s=timeout_s,
            retries=retries,
            backoff_s=backoff_s,
            restart_wait_s=restart_wait_s,
        )

    @property
    def url(self) -> str:
        return self.sync.url

    async def submit(
        self,
        tasks: list[dict[str, Any]],
        n: int = 1,
        *,
        batch_id: str | None = None,
        write: bool | None = None,
        skip_invalid: bool = False,
        resubmit: bool = False,
    ) -> BatchStatus:
        """``RolloutClient.submit``."""
        return await asyncio.to_thread(
            self.sync.submit,
            tasks,
            n,
            batch_id=batch_id,
            write=write,
            skip_invalid=skip_invalid,
            resubmit=resubmit,
        )

    async def batch(self, batch_id: str) -> BatchStatus:
        return await asyncio.to_thread(self.sync.batch, batch_id)

    async def ack(self, batch_id: str, cursor: int) -> BatchStatus:
        return await asyncio.to_thread(self.sync.ack, batch_id, cursor)

    async def delete(self, batch_id: str) -> None:
        await asyncio.to_thread(self.sync.delete, batch_id)

    async def stream(
        self, batch_id: str, cursor: int = 0, ack_every: int | None = None
    ) -> AsyncIterator[StreamedTrajectory]:
        """``RolloutClient.stream``: rows as they finish, reconnecting from the cursor."""
        rows = self.sync.stream(batch_id, cursor, ack_every)
        try:
            while True:
                item = await asyncio.to_thread(next, rows, _DONE)
                if item is _DONE:
                    return
                assert isinstance(item, StreamedTrajectory)
                yield item
        finally:
            await asyncio.to_thread(rows.close)  # closes its connection, in a thread it owns

    async def wait(self, batch_id: str, cursor: int = 0) -> list[TrajectoryRow]:
        """The batch's rows once all are finished."""
        return await asyncio.to_thread(self.sync.wait, batch_id, cursor)

    async def generate(self, tasks: list[dict[str, Any]], n: int = 1) -> list[TrajectoryRow]:
        return await asyncio.to_thread(self.sync.generate, tasks, n)

    async def pause(self, mode: str | None = None) -> PauseAnswer:
        return await asyncio.to_thread(self.sync.pause, mode)

    async def resume(self) -> WeightsAnswer:
        return await asyncio.to_thread(self.sync.resume)

    async def update_weights(
        self, path: str | None = None, version: int | None = None
    ) -> WeightsAnswer:
        return await asyncio.to_thread(self.sync.update_weights, path, version)

    async def stats(self) -> EngineStats:
        return await asyncio.to_thread(self.sync.stats)

    async def info(self) -> ServiceInfo:
        return await asyncio.to_thread(self.sync.info)

    async def output_dir(self) -> str:
        return await asyncio.to_thread(self.sync.output_dir)

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.run, row)
