"""A policy server that fails on purpose: the scripted strategy behind Chat Completions over
real HTTP, with a share of calls answered by 5xx/429, a hang, or garbage JSON.

It runs an aiohttp server on a thread of the test process, so engines in Ray actors and
``rayrollout collect`` subprocesses reach it like any external endpoint. A user message may
carry ``[[always=500]]``, ``[[always=hang]]`` or ``[[always=garbage]]`` to make every call of
that episode fail that way.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
from collections import Counter
from typing import Any

from aiohttp import web
from netutil import AiohttpInThread

from rayrollout.deployments.scripted.protocol import chat_completion
from rayrollout.deployments.scripted.strategy import next_action

FAULTS = ("500", "503", "429", "hang", "garbage")
_ALWAYS = re.compile(r"\[\[always=(\w+)\]\]")


class FlakyPolicy(AiohttpInThread):
    """Chat Completions server failing ``fault_rate`` of calls; counts what it did.

    Example:
        >>> with FlakyPolicy(fault_rate=0.2, seed=1) as policy:  # doctest: +SKIP
        ...     policy.base_url  # http://127.0.0.1:PORT/v1
    """

    def __init__(
        self,
        fault_rate: float = 0.2,
        seed: int = 0,
        hang_s: float = 3.0,
        echo_key: bool = False,
        think_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.fault_rate = fault_rate
        self.think_s = think_s  # every answer takes this long, as a real model's would
        self.in_flight = 0  # calls being answered now, and the most there ever were
        self.most_in_flight = 0
        self.echo_key = echo_key  # error bodies quote the caller's key, as some servers do
        self.hang_s = hang_s
        self.random = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.requests = 0
        self.authorization: set[str] = set()
        self._ids = itertools.count()

    @property
    def faults_injected(self) -> int:
        return sum(self.faults.values())

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    def _fault_for(self, messages: list[dict[str, Any]]) -> str | None:
        prompt = " ".join(str(m.get("content") or "") for m in messages if m["role"] == "user")
        always = _ALWAYS.search(prompt)
        if always:
            return always.group(1)
        if self.random.random() < self.fault_rate:
            return self.random.choice(FAULTS)
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.authorization.add(request.headers.get("Authorization", ""))
        body = await request.json()
        messages = body.get("messages") or []
        fault = self._fault_for(messages)
        if fault is not None:
            self.faults[fault] += 1
        if fault == "hang":
            await asyncio.sleep(self.hang_s)  # past the client's timeout: it gives up first
        elif fault == "garbage":
            return web.Response(text='{"choices": [{"mess', content_type="application/json")
        elif fault is not None:
            message = f"injected fault {fault}"
            if self.echo_key:
                message += f"; key provided: {request.headers.get('Authorization', '')}"
            return web.json_response(
                {"error": {"message": message, "type": "server_error"}},
                status=int(fault),
                headers={"retry-after-ms": "20"},
            )
        if self.think_s:
            await asyncio.sleep(self.think_s)
        action = next_action(messages, body.get("tools") or [])
        answer = chat_completion(action, next(self._ids), body.get("model", "flaky"), 1, 1)
        return web.Response(text=json.dumps(answer), content_type="application/json")
