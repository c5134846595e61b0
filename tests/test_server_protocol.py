"""What a NeMo Gym server speaks, read once from its routes before the run, and the agent
that rows naming none then take.

A real HTTP server on 127.0.0.1 answers ``GET /openapi.json`` as NeMo Gym's FastAPI servers
do (a ``GymnasiumServer`` lists ``/reset`` and ``/step``, a resources server
``/seed_session``); ``tests/nemo_gym/test_nemo_gym_gymnasium.py`` plays NeMo Gym's own.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rayrollout.agentkit.registry import resolve_agent
from rayrollout.api.preflight import detect_server_protocols, server_protocol
from rayrollout.data.config import ConfigError, RunConfig, load_config
from rayrollout.data.schema import Task
from rayrollout.data.tasks import parse_task_row
from rayrollout.envkit.nemo_gym.client import (
    GymnasiumServerEnvironment,
    RemoteEnvironment,
    remote_environment,
)

GYMNASIUM = ["/reset", "/step", "/aggregate_metrics"]
RESOURCES = ["/seed_session", "/close_session", "/verify", "/aggregate_metrics"]


@contextmanager
def routes_server(answer: list[str] | bytes | None) -> Iterator[tuple[str, list[str]]]:
    """A server whose ``/openapi.json`` lists ``answer``'s paths (bytes: that body; None:
    404); yields its URL and the paths it was asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path != "/openapi.json" or answer is None:
                self.send_response(404)
                self.end_headers()
                return
            body = (
                answer
                if isinstance(answer, bytes)
                else json.dumps({"openapi": "3.1.0", "paths": {p: {} for p in answer}}).encode()
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("answer", "protocol"),
    [
        (GYMNASIUM, "gymnasium"),
        (RESOURCES, "resources_server"),
        (["/reset"], None),  # no /step: not Gymnasium's loop
        (None, None),  # 404: lists nothing
        (b"<html>not json</html>", None),
    ],
)
def test_a_servers_kind_is_read_from_the_routes_it_lists(answer, protocol):
    with routes_server(answer) as (url, asked):
        assert server_protocol(url) == protocol
    assert asked == ["/openapi.json"]


def test_a_server_that_does_not_answer_has_no_kind():
    with routes_server(GYMNASIUM) as (url, _):
        pass  # closed: nothing listens there now
    assert server_protocol(url, timeout_s=2) is None


def test_each_url_is_asked_once_and_a_protocol_set_by_hand_is_kept():
    with routes_server(GYMNASIUM) as (url, asked), routes_server(GYMNASIUM) as (other, not_asked):
        config = RunConfig.model_validate(
            {
                "environments": {
                    "bj": {"url": url},
                    "bj_again": {"url": url},
                    "set": {"url": other, "protocol": "resources_server"},
                }
            }
        )
        detect_server_protocols(config)
    assert asked == ["/openapi.json"] and not_asked == []
    assert config.environments["bj"].protocol == "gymnasium"
    assert config.environments["bj_again"].protocol == "gymnasium"
    assert config.environments["set"].protocol == "resources_server"


def _row(fields: dict[str, object]) -> Task:
    """A NeMo Gym row as a task (``own agent``: the task's own ``agent``)."""
    own = fields.pop("own agent", None)
    row = {"responses_create_params": {"input": [{"role": "user", "content": "Deal me in."}]}}
    task = parse_task_row({**row, **fields}, default_environment="bj")
    return task.model_copy(update={"agent": own}) if own else task


@pytest.mark.parametrize(
    ("protocol", "row", "run_agent", "played_by"),
    [
        ("gymnasium", {}, None, "reset_step"),  # no agent named anywhere: the server's kind
        ("gymnasium", {}, "tool_loop", "tool_loop"),  # the user's --agent wins
        ("gymnasium", {"own agent": "tool_loop"}, None, "tool_loop"),  # so does the row's own
        ("gymnasium", {"agent_ref": {"name": "x_simple_agent"}}, None, "tool_loop"),
        ("resources_server", {}, None, "tool_loop"),
        (None, {}, None, "tool_loop"),  # kind unknown: as before, the default agent
        (None, {"agent_ref": {"name": "bj_gymnasium_agent"}}, None, "reset_step"),
    ],
)
def test_the_agent_of_a_row_follows_from_its_servers_kind_when_nothing_names_one(
    protocol, row, run_agent, played_by
):
    settings = RunConfig.model_validate(
        {"environments": {"bj": {"url": "http://127.0.0.1:1", "protocol": protocol}}}
    ).environment_config("bj")
    cls = remote_environment(settings)
    assert cls is (GymnasiumServerEnvironment if protocol == "gymnasium" else RemoteEnvironment)
    assert resolve_agent(_row(dict(row)), run_agent, cls) == played_by


def test_a_protocol_without_a_url_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match="set 'url' too, or drop 'protocol'"):
        load_config(None, {"environments": {"bj": {"protocol": "gymnasium"}}})
