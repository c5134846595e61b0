"""The ``nemo_gym`` agent (rayrollout/agents/nemo_gym.py) and the gateway front
(rayrollout/agentkit/gateway_front.py), without NeMo Gym: the front against a fake gateway, its
port shared by agent instances (and refused when another program holds it), and the agent
against the real gateway with a fake agent server. The whole thing against NeMo Gym's own
``simple_agent`` is in the nemo_gym tier (tests/nemo_gym/test_nemo_gym_agent_by_url.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from netutil import free_port

import rayrollout.agentkit.gateway_front as gateway_front
from rayrollout.agentkit import AgentEpisode, EpisodeEnd, OutOfTurns
from rayrollout.agentkit.gateway import Gateway
from rayrollout.agentkit.gateway_front import (
    FRONT_HEALTH_PATH,
    GATEWAY_FIELD,
    KEY_FIELD,
    FrontKeeper,
    FrontPortTaken,
    GatewayFront,
    is_front,
)
from rayrollout.agents.nemo_gym import NemoGymAgent, _complete_transcript
from rayrollout.data.config import EpisodeConfig, PolicyConfig
from rayrollout.data.schema import FunctionCall, Message, Task, ToolCall, Trajectory, Turn
from rayrollout.policy.call import PolicyReply, PolicyRequest

ROOT = Path(__file__).resolve().parents[2]
WEATHER_ROWS = ROOT / "rayrollout" / "environments" / "weather" / "tasks_nemo_gym.jsonl"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serve(routes: dict[tuple[str, str], Handler]) -> tuple[web.AppRunner, int]:
    """An aiohttp server on a free loopback port with ``routes`` ((method, path) -> handler)."""
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


class FakeGateway:
    """Stands for an episode's gateway: records what reaches it, answers ``answer``."""

    def __init__(self, status: int = 200, answer: Any = None) -> None:
        self.status = status
        self.answer = answer if answer is not None else {"id": "resp_1", "output": []}
        self.seen: list[tuple[str, str, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None
        self.base_url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append((request.path, request.headers.get("Authorization", ""), body))
        return web.json_response(self.answer, status=self.status)

    async def __aenter__(self) -> FakeGateway:
        base = "/e/tok/v1"
        self.runner, port = await _serve(
            {
                ("POST", f"{base}/responses"): self.handle,
                ("POST", f"{base}/chat/completions"): self.handle,
            }
        )
        self.base_url = f"http://127.0.0.1:{port}{base}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def front() -> AsyncIterator[GatewayFront]:
    front = GatewayFront(free_port())
    await front.start()
    yield front
    await front.close()


async def _post(url: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with http.post(url, data=data, headers={"Authorization": "Bearer x"}) as answer:
            return answer.status, await answer.json(content_type=None)


# ------------------------------------------------------------------ the front, on its own


async def test_front_forwards_each_route_to_the_episode_gateway_without_its_metadata(front):
    async with FakeGateway(answer={"id": "resp_9", "output": [], "usage": {"a": 1}}) as gateway:
        metadata = {GATEWAY_FIELD: gateway.base_url, KEY_FIELD: "rr-secret", "trace": "t1"}
        body = {"input": "hi", "model": "m", "metadata": metadata}
        status, answer = await _post(f"{front.url}/responses", body)
        assert (status, answer) == (200, {"id": "resp_9", "output": [], "usage": {"a": 1}})
        chat = {"messages": [{"role": "user", "content": "hi"}], "metadata": dict(metadata)}
        chat["metadata"].pop("trace")
        status, _ = await _post(f"{front.url}/chat/completions", chat)
        assert status == 200
    (path1, auth1, sent1), (path2, auth2, sent2) = gateway.seen
    assert (path1, auth1) == ("/e/tok/v1/responses", "Bearer rr-secret")
    assert sent1 == {"input": "hi", "model": "m", "metadata": {"trace": "t1"}}  # others kept
    assert (path2, auth2) == ("/e/tok/v1/chat/completions", "Bearer rr-secret")
    assert sent2 == {"messages": [{"role": "user", "content": "hi"}]}  # emptied: dropped


async def test_front_passes_the_gateway_errors_on_but_not_a_refused_key(front):
    async with FakeGateway(status=400, answer={"error": {"message": "input: bad"}}) as gateway:
        body = {"input": "hi", "metadata": {GATEWAY_FIELD: gateway.base_url, KEY_FIELD: "k"}}
        assert await _post(f"{front.url}/responses", body) == (
            400,
            {"error": {"message": "input: bad"}},
        )
    refusal = {"error": {"message": "wrong key", "code": "invalid_api_key"}}
    async with FakeGateway(status=401, answer=refusal) as gateway:
        body = {"input": "hi", "metadata": {GATEWAY_FIELD: gateway.base_url, KEY_FIELD: "k"}}
        status, answer = await _post(f"{front.url}/responses", body)
    # NeMo Gym's model client stops using an endpoint for good after a 401 naming a bad key;
    # the front is every episode's endpoint, so one episode's refusal reaches it as a 410.
    assert status == 410
    assert answer["error"]["code"] == "episode_gone"
    assert "refused its key (HTTP 401" in answer["error"]["message"]


async def test_front_refuses_requests_that_name_no_episode_gateway(front):
    status, answer = await _post(f"{front.url}/responses", {"input": "hi"})
    assert status == 400
    message = answer["error"]["message"]
    assert GATEWAY_FIELD in message and KEY_FIELD in message
    assert "responses_create_params.metadata" in message  # what sets them
    status, answer = await _post(f"{front.url}/responses", b"not json")
    assert (status, answer["error"]["code"]) == (400, "invalid_body")
    for gateway, problem in (
        ("http://10.0.0.7:80/e/t/v1", "not a loopback address"),
        ("file:///etc/passwd", "not an http(s) URL"),
        ("http://127.0.0.1:80/admin", "does not end in /v1"),
    ):
        body = {"input": "hi", "metadata": {GATEWAY_FIELD: gateway, KEY_FIELD: "k"}}
        status, answer = await _post(f"{front.url}/chat/completions", body)
        assert status == 400, gateway
        assert problem in answer["error"]["message"], answer


async def test_front_answers_502_when_the_episode_gateway_is_gone(front):
    gone = f"http://127.0.0.1:{free_port()}/e/tok/v1"
    body = {"input": "hi", "metadata": {GATEWAY_FIELD: gone, KEY_FIELD: "k"}}
    status, answer = await _post(f"{front.url}/responses", body)
    assert status == 502
    assert answer["error"]["code"] == "episode_gateway_unreachable"
    assert gone in answer["error"]["message"]


async def test_the_first_keeper_hosts_the_front_others_rely_on_it_and_rebind_it(monkeypatch):
    monkeypatch.setattr(gateway_front, "_RELY_S", 0.0)  # probe at every ensure
    port = free_port()
    first, second = FrontKeeper(port), FrontKeeper(port)
    await asyncio.gather(first.ensure(), second.ensure())
    hosts = [k for k in (first, second) if k.front is not None]
    assert len(hosts) == 1  # one bound the port, the other found it bound and relied on it
    assert await is_front("127.0.0.1", port)
    await hosts[0].close()  # the host actor died
    assert not await is_front("127.0.0.1", port)
    other = second if hosts[0] is first else first
    await other.ensure()  # the next episode elsewhere binds it again
    assert other.front is not None and await is_front("127.0.0.1", port)
    await other.close()


async def test_a_port_held_by_another_program_is_refused_by_name():
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="some other server")

    runner, port = await _serve({("GET", "/{tail:.*}"): hello})
    try:
        with pytest.raises(FrontPortTaken) as refused:
            await FrontKeeper(port).ensure()
        message = str(refused.value)
        assert f"port {port}" in message and "not rayrollout's gateway front" in message
        assert FRONT_HEALTH_PATH in message and "gateway_port" in message
        # The agent ends the episode with it, naming itself.
        agent = NemoGymAgent(url="http://127.0.0.1:9", gateway_port=port)
        with pytest.raises(EpisodeEnd) as ended:
            await agent.play(_episode(Gateway()))
        assert ended.value.status == "error"
        assert ended.value.error.startswith("agent 'nemo_gym': the gateway front on port")
        assert "not rayrollout's gateway front" in ended.value.error
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ the agent, fake server


class ScriptedReplies:
    """A policy that calls get_weather once, then answers (what the scripted policy does)."""

    config = PolicyConfig()

    async def complete(self, request: PolicyRequest) -> PolicyReply:
        messages = request.messages
        if messages[-1].role == "tool":
            reply = Message(role="assistant", content=f"It is {messages[-1].content}.")
        else:
            call = ToolCall(id="call_7", function=FunctionCall(name="get_weather", arguments="{}"))
            reply = Message(role="assistant", tool_calls=[call])
        return PolicyReply(message=reply, turn=Turn(prompt_tokens=3, completion_tokens=2))

    async def close(self) -> None:
        pass


def _episode(
    gateway: Gateway, fields: dict[str, Any] | None = None, limits: EpisodeConfig | None = None
) -> AgentEpisode:
    task = Task(
        task_id="t1",
        environment="weather",
        prompt=[Message(role="user", content="Weather in Oslo?")],
        fields=fields or {},
    )
    trajectory = Trajectory(task_id="t1", sample_index=0, group_id="t1", environment="weather")
    return AgentEpisode(
        task,
        [],
        None,  # type: ignore[arg-type]  (the agent uses no environment session)
        ScriptedReplies(),  # type: ignore[arg-type]
        limits or EpisodeConfig(),
        trajectory,
        "t1:0:abc",
        gateway,
    )


def _fake_agent_server(front_url: str, seen: list[dict[str, Any]]) -> Handler:
    """A /run that plays like simple_agent: model calls through the front (the metadata
    passed through), a tool answered here, then the verify answer echoing the request."""

    async def run(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        params = body["responses_create_params"]
        outputs: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                call = {**params, "input": [*params["input"], *outputs]}
                async with http.post(f"{front_url}/responses", json=call) as answer:
                    if answer.status != 200:  # simple_agent's raise_for_status
                        return web.Response(status=500, text=await answer.text())
                    output = (await answer.json())["output"]
                outputs += output
                calls = [item for item in output if item["type"] == "function_call"]
                if not calls:
                    break
                for item in calls:
                    outputs.append(
                        {"type": "function_call_output", "call_id": item["call_id"], "output": "9C"}
                    )
        response = {"id": "resp_x", "object": "response", "output": outputs}
        return web.json_response(
            {**body, "response": response, "reward": 1.0, "judged": "sunny enough"}
        )

    return run


async def test_the_agent_plays_an_episode_through_the_front_and_the_real_gateway(front):
    seen: list[dict[str, Any]] = []
    runner, port = await _serve({("POST", "/run"): _fake_agent_server(front.url, seen)})
    gateway = Gateway()
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Weather in Oslo?"}],
            "metadata": {"trace": "t1"},
        },
        "expected": "9C",
    }
    episode = _episode(gateway, row)
    try:
        agent = NemoGymAgent(url=f"http://127.0.0.1:{port}/", gateway_port=front.port)
        verdict = await agent.play(episode)
    finally:
        await runner.cleanup()
        await gateway.close()
        if agent._http is not None:
            await agent._http.close()
    (body,) = seen
    metadata = body["responses_create_params"]["metadata"]
    assert metadata["trace"] == "t1" and metadata[GATEWAY_FIELD].startswith("http://127.0.0.1:")
    assert body["expected"] == "9C"  # the row whole, as NeMo Gym's agents take it
    assert "metadata" not in row["responses_create_params"] or row["responses_create_params"][
        "metadata"
    ] == {"trace": "t1"}  # the task's own row is not changed
    assert verdict.reward == 1.0
    assert verdict.details == {"judged": "sunny enough"}  # the echoed request left out
    assert KEY_FIELD not in json.dumps(verdict.details)
    assert len(episode.trajectory.turns) == 2
    assert [m.role for m in episode.messages] == ["user", "assistant", "tool", "assistant"]
    assert episode.messages[-1].content == "It is 9C."


async def test_an_episode_out_of_turns_in_the_agent_server_ends_as_max_turns(front):
    seen: list[dict[str, Any]] = []
    runner, port = await _serve({("POST", "/run"): _fake_agent_server(front.url, seen)})
    gateway = Gateway()
    episode = _episode(gateway, limits=EpisodeConfig(max_turns=1))  # the answer is call 2
    agent = NemoGymAgent(url=f"http://127.0.0.1:{port}", gateway_port=front.port)
    try:
        # The gateway answered the second call 410, simple_agent's /run failed with 500:
        # the episode ends as what the gateway saw, not as the agent server's error.
        with pytest.raises(OutOfTurns):
            await agent.play(episode)
    finally:
        await runner.cleanup()
        await gateway.close()
        if agent._http is not None:
            await agent._http.close()
    assert len(episode.trajectory.turns) == 1


async def test_the_agent_ends_the_episode_naming_the_server_when_run_fails(front):
    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="Internal Server Error")

    async def not_json(request: web.Request) -> web.Response:
        return web.Response(text="<html>")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    runner, port = await _serve(
        {
            ("POST", "/broken/run"): broken,
            ("POST", "/html/run"): not_json,
            ("POST", "/slow/run"): slow,
        }
    )
    down = f"http://127.0.0.1:{free_port()}"
    cases = [
        (f"http://127.0.0.1:{port}/broken", "error", "answered HTTP 500 to POST /run"),
        (f"http://127.0.0.1:{port}/html", "error", "other than a JSON object: <html>"),
        (f"http://127.0.0.1:{port}/slow", "timeout", "did not answer /run within 0.5s"),
        (down, "error", "did not answer POST /run (ClientConnectorError"),
    ]
    gateway = Gateway()
    try:
        for url, status, says in cases:
            agent = NemoGymAgent(url=url, gateway_port=front.port, timeout_s=0.5)
            with pytest.raises(EpisodeEnd) as ended:
                await agent.play(_episode(gateway))
            assert ended.value.status == status, url
            assert ended.value.error.startswith("agent 'nemo_gym': "), ended.value.error
            assert url in ended.value.error and says in ended.value.error, ended.value.error
            if agent._http is not None:
                await agent._http.close()
    finally:
        await runner.cleanup()
        await gateway.close()


def test_tool_answers_after_the_last_model_call_join_the_transcript():
    """An agent server whose loop stopped after running tools (simple_agent's max_steps):
    the final response's last items were never sent to the model, so the gateway did not
    record them; the transcript still ends with them."""
    call = ToolCall(id="c1", function=FunctionCall(name="get_weather", arguments="{}"))
    recorded = [Message(role="user", content="Oslo?"), Message(role="assistant", tool_calls=[call])]
    episode = SimpleNamespace(messages=list(recorded))
    body = {"responses_create_params": {"input": "Oslo?"}}
    output = [
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "9C"},
    ]
    _complete_transcript(episode, body, {"output": output})  # type: ignore[arg-type]
    assert episode.messages[:2] == recorded
    assert [(m.role, m.tool_call_id, m.content) for m in episode.messages[2:]] == [
        ("tool", "c1", "9C")
    ]
    # A final response that does not continue the recorded calls changes nothing.
    other = [{"type": "message", "role": "assistant", "content": "hm"}] * 3
    _complete_transcript(episode, body, {"output": other})  # type: ignore[arg-type]
    assert len(episode.messages) == 3


def test_the_agent_refuses_args_that_cannot_work():
    for args, says in (
        ({"url": "127.0.0.1:8000", "gateway_port": 1}, "not an http(s) URL"),
        ({"url": "http://h", "gateway_port": 70000}, "not a TCP port"),
        ({"url": "http://h", "gateway_port": "80"}, "not an integer"),
        ({"url": "http://h", "gateway_port": 80, "timeout_s": 0}, "not a positive number"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            NemoGymAgent(**args)


# ------------------------------------------------------------------ NeMo Gym's simple_agent
