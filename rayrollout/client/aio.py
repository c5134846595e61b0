"""``AsyncRolloutClient``: the blocking client's calls as coroutines, for trainers on asyncio.

One implementation, two forms: each call runs the blocking client's in a worker thread
(``asyncio.to_thread``), so retries, idempotency keys, cursors and errors are the same code,
and the event loop never waits on a socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from typing_extensions import Unpack  # typing's from Python 3.11; the client runs on 3.10

from rayrollout.client import models
from rayrollout.client.sync import ClientOptions, RolloutClient, SubmitOptions

__all__ = ["AsyncRolloutClient"]

_DONE = object()


class AsyncRolloutClient:
    """The rollout service's client for asyncio; arguments as ``RolloutClient``'s."""

    def __init__(
        self, url: str, token: str | None = None, **options: Unpack[ClientOptions]
    ) -> None:
        self.sync = RolloutClient(url, token, **options)

    @property
    def url(self) -> str:
        return self.sync.url

    async def submit(
        self, tasks: list[dict[str, Any]], n: int = 1, **options: Unpack[SubmitOptions]
    ) -> models.BatchStatus:
        """``RolloutClient.submit``."""
        return await asyncio.to_thread(self.sync.submit, tasks, n, **options)

    async def batch(self, batch_id: str) -> models.BatchStatus:
        return await asyncio.to_thread(self.sync.batch, batch_id)

    async def ack(self, batch_id: str, cursor: int) -> models.BatchStatus:
        return await asyncio.to_thread(self.sync.ack, batch_id, cursor)

    async def delete(self, batch_id: str) -> None:
        await asyncio.to_thread(self.sync.delete, batch_id)

    async def stream(
        self, batch_id: str, cursor: int = 0, ack_every: int | None = None
    ) -> AsyncIterator[models.StreamedTrajectory]:
        """``RolloutClient.stream``: rows as they finish, reconnecting from the cursor."""
        rows = self.sync.stream(batch_id, cursor, ack_every)
        try:
            while True:
                item = await asyncio.to_thread(next, rows, _DONE)
                if item is _DONE:
                    return
                assert isinstance(item, models.StreamedTrajectory)
                yield item
        finally:
            await asyncio.to_thread(rows.close)  # closes its connection, in a thread it owns

    async def wait(self, batch_id: str, cursor: int = 0) -> list[models.TrajectoryRow]:
        """The batch's rows once all are finished."""
        return await asyncio.to_thread(self.sync.wait, batch_id, cursor)

    async def generate(self, tasks: list[dict[str, Any]], n: int = 1) -> list[models.TrajectoryRow]:
        return await asyncio.to_thread(self.sync.generate, tasks, n)

    async def pause(self, mode: str | None = None) -> models.PauseAnswer:
        return await asyncio.to_thread(self.sync.pause, mode)

    async def resume(self) -> models.WeightsAnswer:
        return await asyncio.to_thread(self.sync.resume)

    async def update_weights(
        self, path: str | None = None, version: int | None = None
    ) -> models.WeightsAnswer:
        return await asyncio.to_thread(self.sync.update_weights, path, version)

    async def stats(self) -> models.EngineStats:
        return await asyncio.to_thread(self.sync.stats)

    async def info(self) -> models.ServiceInfo:
        return await asyncio.to_thread(self.sync.info)

    async def output_dir(self) -> str:
        return await asyncio.to_thread(self.sync.output_dir)

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.run, row)
