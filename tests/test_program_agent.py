"""The program agent: an unmodified OpenAI SDK script played per episode through `collect`.

The script (examples/openai_agent.py) runs as a subprocess against the episode's recording
gateway; its faults (a crash, a program that never exits, one that outlives its episode's
time limit, one that retries for ever past max_turns) end only their own episode, with the
status and an error naming the agent, and leave no process of theirs behind.
"""

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from served_policy import scripted_policy_on_serve
from test_gateway import KEY, weather_episode
from typer.testing import CliRunner

from rayrollout import read_trajectories
from rayrollout.agentkit import OutOfTurns
from rayrollout.agentkit.registry import agent_spec
from rayrollout.cli.commands import app

ROOT = Path(__file__).resolve().parents[1]
WEATHER_TASKS = ROOT / "rayrollout" / "environments" / "weather" / "tasks.jsonl"
PROGRAM = "rayrollout.agents.program:ProgramAgent"
SCRIPT = ["python", "examples/openai_agent.py"]  # as a user writes it in the run's YAML

# Writes its pid and its child's to PID_FILE, then waits for ever (so does the child).
HANG = textwrap.dedent(
    """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.environ["PID_FILE"], "w") as file:
        file.write(f"{os.getpid()} {child.pid}")
    print("waiting for nothing", file=sys.stderr, flush=True)
    time.sleep(3600)
    """
)
# Retries every error for ever, as a naive agent loop does.
RETRY_FOR_EVER = textwrap.dedent(
    """
    import json, os
    from openai import OpenAI
    task = json.load(open(os.environ["RAYROLLOUT_TASK_FILE"]))
    client = OpenAI(max_retries=0)
    with open(os.environ["PID_FILE"], "w") as file:
        file.write(str(os.getpid()))
    while True:
        try:
            client.chat.completions.create(model="m", messages=task["messages"])
        except Exception:
            pass
    """
)


def collect(tmp_path, port, tasks, config, *flags):
    out = tmp_path / "out"
    data = {"namespace": f"program-{tmp_path.name}", "ray": {"serve_port": port}, **config}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(
        app,
        ["collect", str(tasks), "--out", str(out), "--policy", "scripted", "--config", str(path)]
        + [str(flag) for flag in flags],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    return {(t.task_id, t.sample_index): t for t in read_trajectories(out)}


def gone(pid):
    """Whether a process no longer runs (exited; a zombie whose parent is gone counts)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_an_unmodified_sdk_script_plays_every_episode(tmp_path, serve_session):
    config = {
        "agent": "program",
        "agent_settings": {
            "program": {"args": {"command": ["python", "examples/openai_agent.py"]}}
        },
        "workers": {"num_workers": 2},
        "concurrency": 16,
    }
    rows = collect(tmp_path, serve_session, WEATHER_TASKS, config, "--num-repeats", 2)
    assert len(rows) == 16
    for trajectory in rows.values():
        assert (trajectory.status, trajectory.error, trajectory.reward) == ("ok", None, 1.0)
        assert trajectory.played_by == "program"
        assert [m.role for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
        turns = trajectory.turns
        assert [t.extends_previous for t in turns] == [False, True]
        assert [t.prompt_message_count for t in turns] == [1, 3]
        assert trajectory.metrics.tool_calls == 1


def test_faulty_programs_end_only_their_episode_and_leave_no_process(tmp_path, serve_session):
    pid_files = {name: tmp_path / f"{name}.pid" for name in ("hang", "stall")}
    crash = "import sys; print('it broke here', file=sys.stderr); sys.exit(3)"
    config = {
        "agent": "program",
        "agent_settings": {
            "program": {"args": {"command": SCRIPT}},
            "crash": {"path": PROGRAM, "args": {"command": ["python", "-c", crash]}},
            "hang": {
                "path": PROGRAM,
                "args": {
                    "command": ["python", "-c", HANG],
                    "timeout_s": 20,
                    "env": {"PID_FILE": str(pid_files["hang"])},
                },
            },
            "stall": {  # no timeout of its own: the episode's time limit cancels it
                "path": PROGRAM,
                "args": {
                    "command": ["python", "-c", HANG],
                    "env": {"PID_FILE": str(pid_files["stall"])},
                },
            },
        },
        "workers": {"num_workers": 1},
        # Long enough for a program to start (import openai, write its pid file) on a busy
        # machine: a limit a slow start reaches ends the "ok" rows, or kills "hang" before it
        # says which processes to look for.
        "episode": {"timeout_s": 45},
    }
    tasks = tmp_path / "tasks.jsonl"
    lines = [
        {"task_id": f"ok{i}", "prompt": f"What's the weather like in City {i}?"} for i in range(4)
    ]
    lines += [
        {"task_id": name, "prompt": "What's the weather like in Oslo?", "agent": name}
        for name in ("crash", "hang", "stall")
    ]
    tasks.write_text(
        "".join(json.dumps({**line, "environment": "weather"}) + "\n" for line in lines)
    )
    rows = {key[0]: t for key, t in collect(tmp_path, serve_session, tasks, config).items()}
    for i in range(4):
        assert (rows[f"ok{i}"].status, rows[f"ok{i}"].reward) == ("ok", 1.0)
    crashed = rows["crash"]
    assert crashed.status == "error" and crashed.played_by == "crash"
    assert "agent 'program': command python -c" in crashed.error
    assert "exited 3: it broke here" in crashed.error
    assert rows["hang"].status == "timeout"
    # Where its time went: no model call, and what it last said.
    assert (
        "did not exit within 20s (killed; 0 model calls took 0s of it; stderr: waiting for "
        "nothing)" in rows["hang"].error
    )
    assert rows["stall"].status == "timeout"
    assert "agent 'stall' did not finish within 45" in rows["stall"].error
    for name, path in pid_files.items():
        pids = [int(pid) for pid in path.read_text().split()]
        assert len(pids) == 2, name
        deadline = time.monotonic() + 5  # the group was killed; its orphan's reaping may lag
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(gone(pid) for pid in pids), (name, pids)


@pytest.fixture(scope="module")
def policy_url(serve_session):
    with scripted_policy_on_serve("program-policy", serve_session, KEY) as url:
        yield url


async def test_a_program_that_retries_for_ever_ends_at_max_turns(policy_url, tmp_path):
    pid_file = tmp_path / "pid"
    spec = agent_spec("program").model_copy(
        update={
            "args": {
                "command": [sys.executable, "-c", RETRY_FOR_EVER],
                "env": {"PID_FILE": str(pid_file)},
                # Far above what the program needs (importing openai, two calls), so a busy
                # machine does not end it here: the program's timeout would raise a plain
                # EpisodeEnd("timeout"), not OutOfTurns.
                "timeout_s": 240,
            }
        }
    )
    agent = spec.create()
    async with weather_episode(policy_url, max_turns=1) as episode:
        with pytest.raises(OutOfTurns):  # ended by the gateway at the second call
            await agent.play(episode)
        assert len(episode.trajectory.turns) == 1
    assert gone(int(pid_file.read_text()))


def test_the_program_environment_holds_no_secret_of_the_agent(monkeypatch):
    from rayrollout.agents.program import ProgramAgent

    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-runs-own-key")
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")

    class Endpoint:
        base_url, api_key, tools_url = "http://gw/v1", "episode-key", "http://gw/tools"

    class Episode:
        episode_id = "e:0:1"

    env = ProgramAgent(["true"], env={"EXTRA": "1"})._environment(
        Episode(), Endpoint(), Path("/tmp/task.json")
    )
    assert env["OPENAI_API_KEY"] == "episode-key" and env["OPENAI_BASE_URL"] == "http://gw/v1"
    assert env["RAYROLLOUT_TASK_FILE"] == "/tmp/task.json" and env["EXTRA"] == "1"
    assert "HF_TOKEN" not in env and "RAY_ADDRESS" not in env
    assert "sk-the-runs-own-key" not in env.values()
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
