"""OpenEnv environments through ``collect`` (the ``openenv`` source, played by its default
agent ``reset_step``: the run names no agent).

Two environments written on ``openenv``'s own server classes (``tests/openenv_envs.py``): an
``MCPEnvironment`` whose FastMCP tools the model calls, and one with a typed pydantic
action. Each is played two ways in one run: by URL, served as OpenEnv serves environments
(its FastAPI app under uvicorn, the episode on its ``/ws`` session), and by class, made in
the workers. Every row's rewards must equal the environment's own when it is made by hand
and stepped with the same actions; negative rewards included.

The scripted policy plays the model: each row's system prompt carries ``[[replies=[...]]]``,
the k-th reply its k-th action (text, or ``{"tool": ..., "arguments": ...}`` for a call).
"""

import asyncio
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("openenv", reason="OpenEnv is not installed: pip install 'rayrollout[openenv]'")

from netutil import free_port  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction  # noqa: E402
from openenv_envs import CounterEnv, GuessAction, GuessEnv  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from rayrollout import read_trajectories  # noqa: E402
from rayrollout.cli.commands import app  # noqa: E402
from rayrollout.data.schema import Message  # noqa: E402
from rayrollout.envkit.openenv.channel import Payload  # noqa: E402
from rayrollout.envkit.openenv.inline import InlineChannel  # noqa: E402
from rayrollout.envkit.openenv.session import OpenEnvEpisode  # noqa: E402
from rayrollout.envkit.openenv.socket import SocketChannel  # noqa: E402
from rayrollout.envkit.reset_step import ResetStepError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MAX_TURNS = 6
SESSIONS = 2  # each server holds this many sessions at most: a leaked one would refuse more


def call(tool, **arguments):
    return {"tool": tool, "arguments": arguments}


# (task id, kind, seed, scripted replies)
PLAYS = [
    ("counter-right", "counter", 3, [call("add", n=4), call("add", x=1), call("submit", answer=7)]),
    ("counter-wrong", "counter", 3, [call("add", n=2), call("submit", answer=99)]),
    ("counter-stops", "counter", 5, [call("add", n=1), "I am done."]),
    ("guess-right", "guess", 3, ['{"guess": 2}', "nope", '{"guess": "x"}', '{"guess": 4}']),
    ("guess-out", "guess", 8, ['{"guess": 1}', '{"guess": 2}', '{"guess": 3}', '{"guess": 4}']),
]


def rows(how):
    for task_id, kind, seed, replies in PLAYS:
        yield {
            "task_id": f"{task_id}-{how}",
            "prompt": [{"role": "system", "content": f"Play. [[replies={json.dumps(replies)}]]"}],
            "environment": f"{kind}_{how}",
            "seed": seed,
        }


def by_hand(kind, seed, replies):
    """The environment class made here and stepped with the same actions, as its own API
    takes them; an action that does not validate is not taken (0, as rayrollout scores it)."""
    env = CounterEnv() if kind == "counter" else GuessEnv()
    env.reset(seed=seed)
    rewards = []
    if kind == "counter":
        env.step(ListToolsAction())
    for turn in range(MAX_TURNS):
        reply = replies[min(turn, len(replies) - 1)]
        if kind == "counter":
            if isinstance(reply, str):  # no tool call: the model stopped
                rewards.append(0.0)
                break
            action = CallToolAction(tool_name=reply["tool"], arguments=reply["arguments"])
        else:
            try:
                action = GuessAction(**json.loads(reply))
            except (ValueError, ValidationError):
                rewards.append(0.0)
                continue
        observation = env.step(action)
        rewards.append(float(observation.reward or 0.0))
        if observation.done:
            break
    env.close()
    return rewards


def serve(app_name, port):
    """OpenEnv's own app for the environment, under uvicorn, as OpenEnv serves it."""
    path = os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OPENENV_TEST_SESSIONS": str(SESSIONS)}
    process = subprocess.Popen(
        # Pings every second, a pong late by a second drops the connection (uvicorn's
        # defaults are 20 s each): sessions must answer them while the model thinks.
        [sys.executable, "-m", "uvicorn", f"openenv_envs:{app_name}", "--port", str(port)]
        + ["--ws-ping-interval", "1", "--ws-ping-timeout", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process


def wait_healthy(port, process, limit_s=120.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the OpenEnv server exited at start"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the OpenEnv server on port {port} did not start in {limit_s}s")


@pytest.fixture(scope="module")
def servers():
    ports = {"counter": free_port(), "guess": free_port()}
    processes = {kind: serve(f"{kind}_app", port) for kind, port in ports.items()}
    try:
        for kind, port in ports.items():
            wait_healthy(port, processes[kind])
        yield {kind: f"http://127.0.0.1:{port}" for kind, port in ports.items()}
    finally:
        for process in processes.values():
            process.terminate()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def openenv_run(tmp_path_factory, serve_session, servers):
    base = tmp_path_factory.mktemp("openenv")
    tasks = base / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for how in ("url", "class") for r in rows(how)))
    source = "rayrollout.envkit.openenv:OpenEnvEnvironment"
    environments = {
        "counter_url": {"path": source, "args": {"url": servers["counter"]}},
        "guess_url": {"path": source, "args": {"url": servers["guess"]}},
        "counter_class": {"path": source, "args": {"env_class": "openenv_envs:CounterEnv"}},
        "guess_class": {"path": source, "args": {"env_class": "openenv_envs:GuessEnv"}},
    }
    config = base / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "namespace": "openenv-tests",
                "ray": {"serve_port": serve_session},
                "episode": {"max_turns": MAX_TURNS},
                "concurrency": SESSIONS,
                "environments": environments,
            }
        )
    )
    out = base / "out"
    args = ["collect", tasks, "-n", "2", "--out", out, "--config", config]  # no --agent
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    found: dict[str, list] = {}
    for trajectory in read_trajectories(out):
        found.setdefault(trajectory.task_id, []).append(trajectory)
    return found


@pytest.mark.parametrize("how", ["url", "class"])
@pytest.mark.parametrize("play", PLAYS, ids=[p[0] for p in PLAYS])
def test_rewards_equal_the_environments_own_for_the_same_actions(openenv_run, play, how):
    task_id, kind, seed, replies = play
    expected = by_hand(kind, seed, replies)
    samples = openenv_run[f"{task_id}-{how}"]
    assert len(samples) == 2
    for trajectory in samples:
        assert trajectory.status == "ok", trajectory.error
        assert [t.step_reward for t in trajectory.turns] == expected
        assert trajectory.reward == math.fsum(expected)
        assert trajectory.verification["source"] == "OpenEnv"


def test_negative_rewards_come_through_unclipped(openenv_run):
    assert openenv_run["counter-wrong-url"][0].reward == -1.5
    assert openenv_run["guess-out-class"][0].reward == -1.0
    assert openenv_run["guess-out-url"][0].verification["steps"] == 4


def test_mcp_tools_are_offered_and_answered_as_tool_messages(openenv_run):
    trajectory = openenv_run["counter-right-url"][0]
    assert [t["function"]["name"] for t in trajectory.tools] == ["add", "submit"]
    assert trajectory.tools[0]["function"]["parameters"]["required"] == ["n"]
    tool_messages = [m for m in trajectory.messages if m.role == "tool"]
    assert [m.content for m in tool_messages][:1] == ["7"]  # seed 3, add 4
    assert "invalid_args" in tool_messages[1].content  # the model's bad arguments, read back
    assert trajectory.verification["final_observation"] == ["correct"]
    assert trajectory.played_by == "reset_step"
    # Every reply was a tool call the environment ran as its step: counted as tool calls.
    assert trajectory.metrics.tool_calls == 3 and trajectory.metrics.tools_used == ["add", "submit"]


def test_a_typed_action_is_the_replys_json_and_a_bad_one_is_read_back(openenv_run):
    trajectory = openenv_run["guess-right-class"][0]
    assert trajectory.tools == []
    first = trajectory.messages[1].content
    assert first.startswith("I picked a number") and '"guess"' in first  # the schema, once
    users = [m.content for m in trajectory.messages if m.role == "user"]
    assert users[1] == "No, go higher."
    assert users[2].startswith("That action was not taken: the reply is not one JSON object")
    assert "guess: Input should be a valid integer" in users[3]


def test_every_session_was_closed(openenv_run):
    # Each server holds SESSIONS sessions at most and served 2 samples x 3 or 2 rows, at most
    # SESSIONS at once: a session left open would have refused a later episode.
    assert sum(len(v) for k, v in openenv_run.items() if k.endswith("-url")) == 10 > SESSIONS


def test_a_session_outlives_the_servers_pings_between_steps(servers):
    async def play():
        episode = OpenEnvEpisode(SocketChannel(servers["guess"], timeout_s=10), {"seed": 3})
        await episode.open()
        try:
            await episode.reset([Message(role="user", content="Guess.")])
            await asyncio.sleep(4)  # a slow model: the server pinged meanwhile
            return await episode.step(Message(role="assistant", content='{"guess": 4}'))
        finally:
            await episode.close()

    result = asyncio.run(play())
    assert result.reward == 1.0 and result.terminated


class _LostServer:
    """A WebSocket server that answers the schema and reset, then drops the session."""

    async def __aenter__(self):
        from aiohttp import web

        async def schema(request):
            return web.json_response({"action": {"properties": {"guess": {"type": "integer"}}}})

        async def socket(request):
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await ws.receive()  # reset
            payload = {"observation": {"feedback": "go"}, "reward": None, "done": False}
            await ws.send_json({"type": "observation", "data": payload})
            await ws.receive()  # step: dropped unanswered
            await ws.close()
            return ws

        application = web.Application()
        application.add_routes([web.get("/schema", schema), web.get("/ws", socket)])
        self.runner = web.AppRunner(application)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return f"http://127.0.0.1:{self.port}"

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


async def first_step_error(episode: OpenEnvEpisode) -> str:
    """Open and reset ``episode``, guess 1: the ``ResetStepError`` that step raises, as text."""
    await episode.open()
    try:
        await episode.reset([Message(role="user", content="Guess.")])
        with pytest.raises(ResetStepError) as refused:
            await episode.step(Message(role="assistant", content='{"guess": 1}'))
        return str(refused.value)
    finally:
        await episode.close()


def test_a_lost_session_is_an_error_naming_it():
    async def play():
        async with _LostServer() as url:
            return await first_step_error(OpenEnvEpisode(SocketChannel(url, timeout_s=10), {}))

    message = asyncio.run(play())
    assert "OpenEnv environment at ws://127.0.0.1:" in message
    assert "the session was lost during step 1" in message


def test_an_unreachable_server_fails_the_episode_naming_the_url():
    async def play():
        episode = OpenEnvEpisode(SocketChannel(f"http://127.0.0.1:{free_port()}", 5), {})
        try:
            with pytest.raises(ResetStepError) as refused:
                await episode.open()
            return str(refused.value)
        finally:
            await episode.close()

    assert "could not be opened" in asyncio.run(play())


def test_a_reward_that_is_not_a_number_fails_the_step_naming_it():
    with pytest.raises(ValidationError):
        Payload.model_validate({"observation": {}, "reward": float("nan")})

    episode = OpenEnvEpisode(InlineChannel("openenv_envs:NanEnv"), {"seed": 1})
    expected = "OpenEnv environment openenv_envs:NanEnv answered step with the reward nan"
    assert asyncio.run(first_step_error(episode)) == expected
