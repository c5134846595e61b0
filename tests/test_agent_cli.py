"""`rayrollout agent list|test` and `collect --agent`, through the real CLI in-process.

``agent test`` plays against ``FlakyPolicy`` with no faults: the scripted strategy behind
Chat Completions over real HTTP on a thread of this process, the kind of OpenAI-compatible
server ``--base-url`` takes. No Ray is started by any test here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flaky_policy import FlakyPolicy
from typer.testing import CliRunner

from rayrollout.agentkit import AgentEpisode
from rayrollout.api.rollout_engine import RolloutEngine
from rayrollout.cli.commands import app
from rayrollout.data.schema import Message

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(*args: Any) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


async def two_voices(episode: AgentEpisode) -> None:
    """A policy turn, a critic's turn on messages of its own, then the policy again."""
    reply = await episode.model()
    episode.messages.append(reply)
    await episode.run_tools(reply)
    note = Message(role="user", content="Critique the answer so far.")
    await episode.model([note], tools=[], speaker="critic")
    episode.messages.append(await episode.model())


@pytest.fixture(scope="module")
def policy() -> Iterator[str]:
    with FlakyPolicy(fault_rate=0.0) as server:
        yield server.base_url


@pytest.fixture(autouse=True)
def no_key_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")


def test_list_shows_each_agent_with_its_docstring_and_target():
    code, output = invoke("agent", "list")
    assert code == 0, output
    assert "tool_loop" in output
    assert "Call the model, run its tool calls, repeat until it answers" in output
    assert "rayrollout.agents.tool_loop:ToolLoop" in output
    assert max(len(line) for line in output.splitlines()) <= 80


def test_tool_loop_plays_weather_and_shows_every_model_call(policy):
    code, output = invoke("agent", "test", "tool_loop", "--env", "weather", "--base-url", policy)
    assert code == 0, output
    assert output.count("(weather) ok, reward 1, 1 tool call(s)") == 3  # -n defaults to 3
    assert "episode 1: weather-0" in output and "episode 3: weather-2" in output
    rows = [line.split("│")[1:-1] for line in output.splitlines() if line.startswith("│")]
    turns = [[cell.strip() for cell in row] for row in rows]
    assert turns[:2] == [
        ["1", "policy", "no: new sequence", "first 1 of transcript", "tool_calls"],
        ["2", "policy", "yes", "first 3 of transcript", "stop"],
    ]
    assert "3 episode(s) of agent 'tool_loop' played without a fault" in output


def test_a_second_speaker_and_messages_of_its_own_are_shown(policy, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "w", "prompt": "What's the weather in Oslo?"}) + "\n")
    args = ("--tasks", tasks, "--env", "weather", "--base-url", policy)
    code, output = invoke("agent", "test", "test_agent_cli:two_voices", *args)
    assert code == 0, output
    turns = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in output.splitlines()
        if line.startswith("│")
    ]
    assert [t[1:4] for t in turns] == [
        ["policy", "no: new sequence", "first 1 of transcript"],
        ["critic", "no: new sequence", "1 own message(s)"],
        ["policy", "yes", "first 3 of transcript"],
    ]


def test_an_unknown_agent_is_one_line_naming_the_registered_ones():
    code, output = invoke("agent", "test", "nope", "--env", "weather")
    assert code == 2
    line = one_error_line(output)
    assert "unknown agent 'nope'" in line and "Registered: " in line and "tool_loop" in line


def test_args_that_do_not_fit_the_agent_are_one_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"agent_settings": {"tool_loop": {"args": {"patience": 3}}}}))
    code, output = invoke("agent", "test", "tool_loop", "--env", "weather", "--config", config)
    assert code == 2
    line = one_error_line(output)
    assert "agent_settings.tool_loop.args ['patience'] do not fit" in line


def test_args_the_agent_refuses_are_one_line(tmp_path):
    config = tmp_path / "run.yaml"
    settings = {"context_budget": {"args": {"max_prompt_tokens": 0}}}
    config.write_text(yaml.safe_dump({"agent_settings": settings}))
    code, output = invoke("agent", "test", "context_budget", "--env", "weather", "--config", config)
    assert code == 2
    line = one_error_line(output)
    assert "agent 'context_budget' (rayrollout.agents.context_budget:ContextBudget) refused" in line
    assert "ValueError: max_prompt_tokens must be >= 1" in line


def test_config_args_reach_the_agent(policy, tmp_path):
    config = tmp_path / "run.yaml"
    settings = {"path": "fixture_agents:answer_once", "args": {"suffix": " (once)"}}
    config.write_text(yaml.safe_dump({"agent_settings": {"once": settings}}))
    args = ("--env", "weather", "-n", 1, "--base-url", policy, "--config", config)
    code, output = invoke("agent", "test", "once", *args)
    assert code == 0, output
    assert "1 episode(s) of agent 'once' played without a fault" in output


def test_a_program_agent_plays_through_the_recording_gateway(policy, tmp_path):
    # examples/openai_agent.py, an OpenAI SDK script, run per episode by the program agent:
    # `agent test` hands agents the recording gateway as a worker actor does.
    command = [sys.executable, str(ROOT / "examples/openai_agent.py")]
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"agent_settings": {"program": {"args": {"command": command}}}})
    )
    args = ("--env", "weather", "-n", 1, "--base-url", policy, "--config", config)
    code, output = invoke("agent", "test", "program", *args)
    assert code == 0, output
    assert "(weather) ok, reward 1, 1 tool call(s)" in output
    assert "1 episode(s) of agent 'program' played without a fault" in output


def test_without_a_server_the_scripted_policy_plays_in_this_process():
    code, output = invoke("agent", "test", "tool_loop", "--env", "weather", "-n", 2)
    assert code == 0, output
    assert "the scripted policy, in this process" in output
    assert output.count("(weather) ok, reward 1, 1 tool call(s)") == 2
    assert "2 episode(s) of agent 'tool_loop' played without a fault" in output


@pytest.mark.parametrize(
    ("agent", "status", "error"),
    [
        ("Raises", "error", "agent 'fixture_agents:Raises' failed: ValueError: the harness"),
        ("Hangs", "timeout", "agent 'fixture_agents:Hangs' did not finish within 0.5s"),
        ("Garbage", "error", "agent 'fixture_agents:Garbage' returned dict"),
    ],
)
def test_a_faulty_agent_fails_the_command_naming_it(policy, agent, status, error):
    args = ("--env", "weather", "-n", 1, "--base-url", policy, "--episode-timeout", 0.5)
    code, output = invoke("agent", "test", f"fixture_agents:{agent}", *args)
    assert code == 1, output
    assert f"FAILED episode 1 (task weather-0): {status}: {error}" in output


class Started(Exception):
    """Raised where the run would start Ray: the checks let it through."""


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The run's agent each time the engine would start Ray (stopped there with ``Started``)."""
    started: list[str | None] = []

    def start(self: RolloutEngine, *args: Any, **kwargs: Any) -> RolloutEngine:
        started.append(self.config.agent)
        raise Started

    monkeypatch.setattr(RolloutEngine, "_start", start)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return started


def test_collect_agent_flag_sets_the_runs_agent(tmp_path, starts):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "hi", "environment": "weather"}) + "\n")
    result = runner.invoke(
        app, ["collect", str(tasks), "--agent", "context_budget", "--out", str(tmp_path / "o")]
    )
    assert isinstance(result.exception, Started), result.output
    assert starts == ["context_budget"]


def test_collect_with_an_unknown_agent_stops_before_ray_starts(tmp_path, starts):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "hi", "environment": "weather"}) + "\n")
    code, output = invoke("collect", tasks, "--agent", "nope", "--out", tmp_path / "out")
    assert code == 2 and starts == [], output
    line = one_error_line(output)
    assert "unknown agent 'nope' in --agent" in line
    known = line.split("Known agents: ")[1].split(" (")[0].split(", ")
    assert "tool_loop" in known and "`rayrollout agent list`" in line
    assert not (tmp_path / "out").exists()
