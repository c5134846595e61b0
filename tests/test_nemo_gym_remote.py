"""Remote NeMo Gym resources servers as environments: a server written here, not rayrollout's.

The server below is plain FastAPI speaking NeMo Gym's resources-server protocol the way its
servers do: a session cookie set at /seed_session, one route per tool, /verify answering
the request echoed back plus ``reward``, /close_session.
"""

import json
import uuid
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from netutil import ServedApp, free_port
from openai.types.responses import Response
from typer.testing import CliRunner

from rayrollout.cli.commands import app as cli_app
from rayrollout.data.config import EnvironmentConfig
from rayrollout.data.schema import Message
from rayrollout.data.tasks import parse_task_row
from rayrollout.envkit import Episode
from rayrollout.envkit.nemo_gym.client import (
    NemoGymConnections,
    NemoGymError,
    items_to_messages,
)

ROOT = Path(__file__).resolve().parents[1]
NEMO_GYM_TASKS = ROOT / "rayrollout" / "environments" / "weather" / "tasks_nemo_gym.jsonl"
COOKIE = "nemo_gym_session"


class ResourcesServer(ServedApp):
    """A NeMo Gym-style weather resources server that records every call per session."""

    def __init__(self, fail_first: int = 0, close_status: int = 200, seeds: bool = True) -> None:
        self.close_status = close_status
        self.close_bodies: list[dict] = []
        self.calls: dict[str, list[str]] = defaultdict(list)
        self.verify_bodies: list[dict] = []
        self.seed_bodies: list[dict] = []
        self.fail_first = fail_first
        self.app = FastAPI()
        if seeds:  # NeMo Gym's Gymnasium-style servers have /reset and /step instead
            self.app.post("/seed_session")(self.seed_session)
        self.app.post("/verify")(self.verify)
        self.app.post("/close_session")(self.close_session)
        self.app.post("/get_weather")(self.get_weather)
        super().__init__(self.app)

    def session(self, request: Request) -> str:
        return request.cookies.get(COOKIE, "no-cookie")

    async def seed_session(self, request: Request) -> JSONResponse:
        if self.fail_first > 0:
            self.fail_first -= 1
            return JSONResponse({"detail": "warming up"}, status_code=503)
        self.seed_bodies.append(await request.json())
        session = uuid.uuid4().hex
        self.calls[session].append("seed_session")
        response = JSONResponse({})
        response.set_cookie(COOKIE, session)
        return response

    async def get_weather(self, request: Request) -> dict:
        body = await request.json()
        self.calls[self.session(request)].append("get_weather")
        return {"city": body["city"], "weather_description": "The weather is cold"}

    async def verify(self, request: Request) -> dict:
        body = await request.json()
        self.calls[self.session(request)].append("verify")
        self.verify_bodies.append(body)
        called = [i for i in body["response"]["output"] if i["type"] == "function_call"]
        return {**body, "reward": 1.0 if called else 0.0, "tool_calls_seen": len(called)}

    async def close_session(self, request: Request) -> JSONResponse:
        self.calls[self.session(request)].append("close_session")
        body = await request.json()
        self.close_bodies.append(body)
        if not body.get("resources_session_id") or "rollout_id" not in body.get("episode_id", {}):
            # NeMo Gym 0.7.0 requires both (ResourcesCloseSessionRequest).
            return JSONResponse({"detail": "Field required"}, status_code=422)
        return JSONResponse(
            {"resources_session_id": body["resources_session_id"]}, status_code=self.close_status
        )


runner = CliRunner()


def collect(tmp_path, port, tasks, *args, environments=None):
    """``rayrollout collect TASKS ARGS`` in-process; rows naming no environment go to the
    ``gym_weather`` server. Returns the output rows."""
    config = tmp_path / "run.yaml"
    data = {"namespace": f"gym-{tmp_path.name}", "ray": {"serve_port": port}}
    if environments:
        data["environments"] = environments
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    command = ["collect", str(tasks), "--env", "gym_weather", *map(str, args)]
    result = runner.invoke(cli_app, [*command, "--out", str(out), "--config", str(config)])
    assert result.exit_code == 0, result.output
    return pd.read_parquet(out)


def test_collect_with_env_url_plays_every_episode_on_the_remote_server(tmp_path, serve_session):
    rows = [json.loads(line) for line in NEMO_GYM_TASKS.read_text().splitlines() if line]
    # A second server, named in the YAML config, takes the rows that name it.
    tasks = tmp_path / "tasks.jsonl"
    extra = {**rows[0], "environment": "gym_yaml"}
    tasks.write_text("".join(json.dumps(r) + "\n" for r in [*rows, extra]))
    with ResourcesServer() as server, ResourcesServer() as yaml_server:
        frame = collect(
            tmp_path,
            serve_session,
            tasks,
            "--env-url",
            f"gym_weather={server.url}",
            "-n",
            "2",
            environments={"gym_yaml": {"url": yaml_server.url, "max_retries": 1}},
        )

    assert len(frame) == 2 * (len(rows) + 1)
    assert set(frame["status"]) == {"ok"}, frame["error"].tolist()
    assert frame["reward"].tolist() == [1.0] * len(frame)
    assert (frame["environment"] == "gym_yaml").sum() == 2
    # Each episode had its own session, and each session saw the whole protocol in order.
    assert len(server.calls) == 2 * len(rows)
    assert len(yaml_server.calls) == 2
    for calls in [*server.calls.values(), *yaml_server.calls.values()]:
        assert calls == ["seed_session", "get_weather", "verify", "close_session"]
    # The tool's JSON answer reached the model as text.
    for messages in frame["messages"]:
        assert json.loads(messages[-2]["content"])["weather_description"] == "The weather is cold"
    # /seed_session got the task row, /verify the row's own request and a Responses object.
    assert sorted(json.dumps(b, sort_keys=True) for b in server.seed_bodies) == sorted(
        json.dumps(r, sort_keys=True) for r in rows for _ in range(2)
    )
    for body in server.verify_bodies + yaml_server.verify_bodies:
        # The whole task row, as NeMo Gym's agents send it: every verifier field is there.
        assert {k: v for k, v in body.items() if k != "response"} in [*rows, extra]
        response = Response.model_validate(body["response"])
        kinds = [item.type for item in response.output]
        assert kinds == ["function_call", "function_call_output", "message"]
        assert response.output[0].name == "get_weather"
        assert response.output[1].call_id == response.output[0].call_id
    # What the verify answer holds beyond the echoed request lands in `verification`.
    for verification in frame["verification"]:
        assert json.loads(verification) == {"tool_calls_seen": 1}


TASK = parse_task_row(
    json.loads(NEMO_GYM_TASKS.read_text().splitlines()[0]), default_environment="gym"
)


async def test_a_server_answering_503_is_retried_with_backoff():
    pool = NemoGymConnections()
    with ResourcesServer(fail_first=2) as server:
        session = pool.session("gym", EnvironmentConfig(url=server.url, max_retries=2), TASK)
        await session.setup()
        result = await session.call_tool("get_weather", '{"city": "Oslo"}')
        await session.close()
    await pool.close()
    assert not result.is_error
    assert list(server.calls.values()) == [["seed_session", "get_weather", "close_session"]]


async def test_an_answer_after_retries_names_the_failed_attempt_before_it():
    # A retried /verify can meet a session the failed attempt already ended: the error
    # must carry that first failure, the cause, not only the last answer.
    pool = NemoGymConnections()
    with ResourcesServer(fail_first=2) as server:
        session = pool.session("gym", EnvironmentConfig(url=server.url, max_retries=1), TASK)
        with pytest.raises(NemoGymError) as failed:
            await session.setup()
    await pool.close()
    assert str(failed.value).endswith(
        'answered HTTP 503 to POST /seed_session: {"detail":"warming up"} '
        '(after a failed attempt: HTTP 503: {"detail":"warming up"})'
    )


async def test_a_server_with_neither_seed_session_nor_reset_is_named_as_neither_kind():
    """No /seed_session makes it a Gymnasium-style server; no /reset either fails its reset."""
    from rayrollout.envkit.reset_step import ResetStepError, reset_step_session

    pool = NemoGymConnections()
    with ResourcesServer(seeds=False) as server:
        session = pool.session("gym", EnvironmentConfig(url=server.url, max_retries=0), TASK)
        await session.setup()
        stepped = reset_step_session(session)
        assert stepped is not None
        with pytest.raises(ResetStepError, match="has no POST /seed_session and no POST /reset"):
            await stepped.reset(list(TASK.prompt))
        await session.close()
    await pool.close()


async def test_an_unreachable_server_fails_naming_the_url_and_the_route():
    pool = NemoGymConnections()
    url = f"http://127.0.0.1:{free_port()}"
    session = pool.session("gym", EnvironmentConfig(url=url, max_retries=1), TASK)
    with pytest.raises(NemoGymError, match=rf"'gym' at {url} did not answer POST /seed_session"):
        await session.setup()
    await session.close()
    await pool.close()


async def test_model_mistakes_come_back_as_tool_errors_without_a_request():
    pool = NemoGymConnections()
    with ResourcesServer() as server:
        session = pool.session("gym", EnvironmentConfig(url=server.url), TASK)
        await session.setup()
        unknown = await session.call_tool("verify", "{}")
        not_json = await session.call_tool("get_weather", "{city: Oslo")
        await session.close()
    await pool.close()
    assert unknown.is_error and "unknown tool 'verify'" in unknown.content
    assert "Available tools: get_weather" in unknown.content
    assert not_json.is_error and "not valid JSON" in not_json.content
    assert list(server.calls.values()) == [["seed_session", "close_session"]]


def test_responses_items_read_back_as_the_same_chat_messages():
    from rayrollout.data.responses import episode_response
    from rayrollout.data.schema import FunctionCall, ToolCall

    messages = [
        *TASK.prompt,
        Message(
            role="assistant",
            content="Let me look.",
            tool_calls=[
                ToolCall(id="c1", function=FunctionCall(name="get_weather", arguments="{}")),
                ToolCall(id="c2", function=FunctionCall(name="get_weather", arguments="{}")),
            ],
        ),
        Message(role="tool", tool_call_id="c1", content="sunny"),
        Message(role="tool", tool_call_id="c2", content="rain"),
        Message(role="assistant", content="Sunny, then rain."),
    ]
    response = episode_response(TASK, messages)
    Response.model_validate(response)
    again = items_to_messages(TASK.fields["responses_create_params"]["input"])
    again += items_to_messages(response["output"])
    assert [m.model_dump(exclude_none=True) for m in again] == [
        m.model_dump(exclude_none=True) for m in messages
    ]
    assert Episode(task=TASK, messages=again).final_answer() == "Sunny, then rain."


def test_env_url_flag_needs_a_name_and_an_http_url():
    from rayrollout.cli.collect import parse_env_urls
    from rayrollout.data.config import ConfigError

    assert parse_env_urls(["a=http://h:1", "http://h:2"], "b") == {
        "a": {"url": "http://h:1"},
        "b": {"url": "http://h:2"},
    }
    with pytest.raises(ConfigError, match="expected NAME=URL"):
        parse_env_urls(["http://h:2"])
    with pytest.raises(ValueError, match="url must start with http"):
        EnvironmentConfig(url="h:1")
    with pytest.raises(ValueError, match="drop 'path' and 'hosting'"):
        EnvironmentConfig(url="http://h:1", hosting="serve")


def test_a_session_that_fails_to_close_keeps_its_reward_and_is_counted(tmp_path, serve_session):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(NEMO_GYM_TASKS.read_text().splitlines()[0] + "\n")
    with ResourcesServer(close_status=500) as server:
        environments = {"gym_weather": {"url": server.url, "max_retries": 1}}
        frame = collect(tmp_path, serve_session, tasks, environments=environments)
    assert frame["status"].tolist() == ["ok"] and frame["reward"].tolist() == [1.0]
    assert "answered HTTP 500 to POST /close_session" in frame["close_error"][0]
    # Each close named its session and episode in 0.7.0's form, the same id in both.
    for body in server.close_bodies:
        assert body["resources_session_id"] == body["episode_id"]["rollout_id"]
        assert body["episode_id"]["attempt"] == 0
