"""A NeMo Gym resources server for the weather environment, as light as one can be written.

The "remote NeMo Gym URL" hosting mode of ``overhead.py`` needs a resources server in its own
process, like a NeMo Gym server a team already runs. This one is plain aiohttp (no Ray, no
FastAPI) so that the benchmark measures the engine's client side, not a slow server:
``POST /seed_session`` sets a session cookie, ``/get_weather`` runs the tool, ``/verify``
scores the Responses-API episode and ends the session, ``/close_session`` drops it.

    python benchmarks/nemo_gym_server.py [CPU_MS] PORT

``CPU_MS`` (default 0) is CPU spent on every request besides the server's own work, as a
server that validates and scores with heavier models would (``overhead.py --server-cpu-ms``).
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from common import spend_cpu

from rayrollout.data.responses import items_to_messages
from rayrollout.data.schema import Task
from rayrollout.data.tasks import parse_task_row
from rayrollout.environments.weather.env import WeatherEnv
from rayrollout.envkit import Episode

COOKIE = "session"


def make_app(cpu_ms: float = 0.0) -> web.Application:
    sessions: dict[str, WeatherEnv] = {}

    def task_of(row: dict[str, Any]) -> Task:
        return parse_task_row(row, default_environment="weather", source="request")

    async def seed_session(request: web.Request) -> web.Response:
        task = task_of(await request.json())
        key = uuid.uuid4().hex
        env = WeatherEnv(task)
        await env.setup()
        sessions[key] = env
        response = web.json_response({})
        response.set_cookie(COOKIE, key)
        return response

    def env_of(request: web.Request) -> WeatherEnv:
        env = sessions.get(request.cookies.get(COOKIE, ""))
        if env is None:
            raise web.HTTPNotFound(text="no such session: POST /seed_session first")
        return env

    async def get_weather(request: web.Request) -> web.Response:
        env = env_of(request)
        body = await request.read()
        result = await env.call_tool("get_weather", body.decode() or "{}")
        return web.Response(text=result.content, status=400 if result.is_error else 200)

    async def verify(request: web.Request) -> web.Response:
        key = request.cookies.get(COOKIE, "")
        env = env_of(request)
        body = await request.json()
        task = task_of({"responses_create_params": body["responses_create_params"]})
        messages = list(task.prompt) + items_to_messages(body["response"]["output"])
        verdict = await env.verify(Episode(task=task, messages=messages))
        sessions.pop(key, None)
        return web.json_response({**body, "reward": verdict.reward})

    async def close_session(request: web.Request) -> web.Response:
        sessions.pop(request.cookies.get(COOKIE, ""), None)
        return web.json_response({})

    @web.middleware
    async def spend(request: web.Request, handler: Handler) -> web.StreamResponse:
        spend_cpu(cpu_ms)
        return await handler(request)

    app = web.Application(middlewares=[spend] if cpu_ms else [])
    for route, handler in (
        ("/seed_session", seed_session),
        ("/get_weather", get_weather),
        ("/verify", verify),
        ("/close_session", close_session),
    ):
        app.router.add_post(route, handler)
    return app


if __name__ == "__main__":
    web.run_app(
        make_app(float(sys.argv[1]) if len(sys.argv) > 2 else 0.0),
        host="127.0.0.1",
        port=int(sys.argv[-1]),
        print=None,
        access_log=None,
        backlog=4096,
    )
