"""The sweep's own judgement (``sweep.py``): which agent plays a server, what is an error.

The sweep is run by hand, not in CI, so these checks keep the parts that decide its count
honest: a GymnasiumServer's rows go to the ``reset_step`` agent, as do rows whose first
observation is the server's, and the 404s a GymnasiumServer's protocol calls for are not
protocol errors while the same 404 from a tool-calling server is. No server is started:
the servers are classified from NeMo Gym's own wheel, and the access lines are ng_run's.
"""

from __future__ import annotations

from pathlib import Path

from sweep_classify import RESET_STEP, classify
from sweep_play import Sweep, played_by

from rayrollout.data.tasks import read_tasks


def _rows(ng_src: Path, name: str) -> list:
    path = ng_src / "resources_servers" / name / "data" / "example.jsonl"
    return list(read_tasks(path, default_environment=name))


def test_reset_step_servers_and_seeded_rows_are_played_by_reset_step(ng_src: Path) -> None:
    blackjack = classify("blackjack")
    assert blackjack.category == "offline"
    assert blackjack.gymnasium and blackjack.agent == RESET_STEP
    assert {played_by(blackjack, t).agent for t in _rows(ng_src, "blackjack")} == {RESET_STEP}

    tools = classify("example_single_tool_call")
    assert not tools.gymnasium and tools.agent == ""
    assert {played_by(tools, t).agent for t in _rows(ng_src, "example_single_tool_call")} == {None}

    # toolsandbox's rows carry only a seed request: its server opens each episode.
    toolsandbox = classify("toolsandbox")
    assert not toolsandbox.gymnasium
    rows = _rows(ng_src, "toolsandbox")
    assert rows and all(t.opening == "seed_session" for t in rows)
    assert {played_by(toolsandbox, t).agent for t in rows} == {RESET_STEP}
    assert toolsandbox.agent == RESET_STEP


class _Log:
    def __init__(self, text: str) -> None:
        self.text = text

    def log(self) -> str:
        return self.text


def _access(process: str, route: str, status: int) -> str:
    return f'({process}) INFO:     127.0.0.1:5555 - "POST /{route} HTTP/1.1" {status} OK\n'


def test_only_the_404s_a_gymnasium_server_calls_for_are_not_protocol_errors(
    tmp_path: Path,
) -> None:
    blackjack, tools = classify("blackjack"), classify("example_single_tool_call")
    for server in (blackjack, tools):
        server.started = True
    log = "".join(
        [
            _access(blackjack.top, "seed_session", 404),
            _access(blackjack.top, "reset", 200),
            _access(blackjack.top, "step", 200),
            _access(blackjack.top, "close", 404),
            _access(blackjack.top, "step", 422),
            _access(tools.top, "seed_session", 404),
            _access(tools.top, "get_weather", 404),
        ]
    )
    Sweep(tmp_path, 0).record_access([blackjack, tools], _Log(log))  # type: ignore[arg-type]
    assert blackjack.protocol_errors == ["POST /step -> 422 x1"]
    # A tool route's 404 is a tool error the model reads, not a protocol error.
    assert tools.protocol_errors == ["POST /seed_session -> 404 x1"]
