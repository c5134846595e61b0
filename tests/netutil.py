"""Network helpers shared by test modules (a plain module: ``conftest`` names are shadowed
when pytest loads the cluster tier's own conftest)."""

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Self

from aiohttp import web

from rayrollout.ports import can_bind
from rayrollout.ports import free_port as free_port  # tests bind 127.0.0.1 only, its default


def port_is_free(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 can be bound now (nothing listens on it)."""
    return can_bind("127.0.0.1", port)


class ServedApp:
    """An ASGI app served by uvicorn on a free 127.0.0.1 port in a daemon thread, for the
    length of a ``with`` block: a test's stand-in for a remote server (``url``)."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, f"the test server at {self.url} did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class AiohttpInThread(ABC):
    """An aiohttp app on a free 127.0.0.1 port, on an event loop of its own thread, for the
    length of a ``with`` block: a stand-in model server the code under test calls over
    HTTP (``base_url`` ends in ``/v1``). A subclass adds its routes in ``routes``."""

    def __init__(self) -> None:
        self.base_url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @abstractmethod
    def routes(self, app: web.Application) -> None:
        """Add the app's routes."""

    def __enter__(self) -> Self:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    async def _start(self) -> int:
        app = web.Application()
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@asynccontextmanager
async def served_routes(routes: dict[str, Any]) -> AsyncIterator[str]:
    """Serve ``routes`` (path -> aiohttp POST handler) on a free 127.0.0.1 port, on the test's
    own event loop, for the length of an ``async with``; yields the base URL, ``.../v1``."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()
