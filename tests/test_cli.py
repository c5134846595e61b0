"""The command line as a user runs it: in-process on the session's Ray, and as a real process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import yaml
from typer.testing import CliRunner

from rayrollout.cli.commands import app

ROOT = Path(__file__).resolve().parents[1]
NEMO_GYM_TASKS = ROOT / "environments" / "weather" / "tasks_nemo_gym.jsonl"
runner = CliRunner()


def write_config(tmp_path, port, **extra):
    data = {
        "namespace": f"cli-{tmp_path.name}",
        "ray": {"serve_port": port},
        "environments": {"echo": {"path": "fixture_envs:EchoEnv"}},
        **extra,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_nemo_gym_rows_run_through_collect_with_full_reward(tmp_path, serve_session):
    out = tmp_path / "out"
    code, output = invoke(
        "collect",
        NEMO_GYM_TASKS,
        "--env",
        "weather",
        "--policy",
        "scripted",
        "--out",
        out,
        "--config",
        write_config(tmp_path, serve_session),
    )
    assert code == 0, output
    frame = pd.read_parquet(out)
    assert len(frame) == sum(1 for line in NEMO_GYM_TASKS.read_text().splitlines() if line.strip())
    assert frame["reward"].mean() == 1.0
    assert set(frame["status"]) == {"ok"}
    assert "rollout summary" in output and "weather" in output


def test_bad_rows_are_listed_one_per_row_and_nothing_runs(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "\n".join(
            [
                '{"prompt": "fine", "environment": "weather"}',
                '{"prompt": "broken", ',
                '{"environment": "weather"}',
                '{"prompt": "hi", "environment": "atlantis"}',
                '{"prompt": ["not", "messages"], "environment": "weather"}',
            ]
        )
        + "\n"
    )
    code, output = invoke("collect", tasks, "--out", tmp_path / "out")
    assert code == 2
    assert "tasks.jsonl line 2: malformed JSON" in output
    assert "tasks.jsonl line 3, field 'prompt': missing" in output
    assert "tasks.jsonl line 4, field 'environment': unknown environment 'atlantis'" in output
    assert "tasks.jsonl line 5, field 'prompt[0]'" in output
    assert "4 invalid row(s)" in output
    assert not (tmp_path / "out").exists()


def test_skip_invalid_runs_the_good_rows_and_keeps_the_rejects(tmp_path, serve_session):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "\n".join(
            [
                '{"task_id": "a", "prompt": "say a", "environment": "echo"}',
                '{"task_id": "b", "prompt": 7, "environment": "echo"}',
                "not json",
                '{"task_id": "c", "prompt": "say c", "environment": "echo"}',
            ]
        )
        + "\n"
    )
    out = tmp_path / "out"
    code, output = invoke(
        "collect",
        tasks,
        "--out",
        out,
        "--skip-invalid",
        "--config",
        write_config(tmp_path, serve_session),
    )
    assert code == 0, output
    assert sorted(pd.read_parquet(out)["task_id"]) == ["a", "c"]
    rejects = [json.loads(line) for line in (out / "_rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejects] == [(2, "prompt"), (3, None)]
    assert rejects[1]["raw"] == "not json"


def test_demo_writes_scored_multi_turn_trajectories(tmp_path, serve_session):
    out = tmp_path / "demo"
    code, output = invoke(
        "demo", "--out", out, "-n", "2", "--config", write_config(tmp_path, serve_session)
    )
    assert code == 0, output
    frame = ds.dataset(out, format="parquet").to_table().to_pandas()
    assert set(frame["environment"]) == {"weather", "math", "code"}
    assert frame["reward"].between(0, 1).all()
    assert set(frame["status"]) == {"ok"}
    for messages in frame["messages"]:
        roles = [m["role"] for m in messages]
        assert roles[-3:] == ["assistant", "tool", "assistant"]
        assert messages[-3]["tool_calls"][0]["function"]["name"]
        assert messages[-1]["content"]
    assert frame.groupby("environment")["reward"].mean().min() == 1.0


def test_resume_after_a_killed_run_writes_exactly_the_missing_rows(tmp_path):
    """A real `rayrollout collect` process is SIGKILLed mid-run; --resume completes it."""
    n_tasks, repeats = 60, 2
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "task_id": f"w{i}",
                    "prompt": f"What's the weather like in City {i}?",
                    "environment": "weather",
                }
            )
            + "\n"
            for i in range(n_tasks)
        )
    )
    config = tmp_path / "slow.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "policy": {"scripted": {"latency_s": 0.25}},
                "output": {"rows_per_part": 10, "flush_interval_s": 0.5},
                "concurrency": 8,
                "ray": {"serve_port": 18_000 + os.getpid() % 1000, "num_cpus": 2},
            }
        )
    )
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "rayrollout.cli",
        "collect",
        str(tasks),
        "--out",
        str(out),
        "-n",
        str(repeats),
        "--config",
        str(config),
    ]
    process = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("part-*.parquet"))) < 2:
            assert process.poll() is None, "the run ended before it could be interrupted"
            assert time.monotonic() < deadline, "no part file appeared in time"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    partial = pd.read_parquet(out)
    assert 0 < len(partial) < n_tasks * repeats
    for part in out.glob("part-*.parquet"):  # the kill left only whole parts
        assert pq.read_table(part).num_rows > 0, part

    resumed = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    frame = pd.read_parquet(out)
    keys = list(zip(frame["task_id"], frame["sample_index"], strict=True))
    assert len(keys) == len(set(keys)) == n_tasks * repeats
    assert set(keys) == {(f"w{i}", s) for i in range(n_tasks) for s in range(repeats)}
    parts = sorted(out.glob("part-*.parquet"))
    assert sum(pq.read_table(part).num_rows for part in parts) == n_tasks * repeats
    assert list(out.glob(".part-*.tmp")) == []  # the killed run's half-written part is gone


def test_external_endpoint_with_jsonl_output_never_records_the_key(
    tmp_path, serve_session, monkeypatch
):
    from ray import serve
    from rayrollout.deployments.scripted import scripted_policy_app

    from rayrollout import Trajectory

    serve.run(
        scripted_policy_app(model="ext-model"), name="external-policy", route_prefix="/external"
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-do-not-leak-42")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"task_id": f"e{i}", "prompt": f"echo {i}", "environment": "echo"}) + "\n"
            for i in range(4)
        )
    )
    out = tmp_path / "out"
    code, output = invoke(
        "collect",
        tasks,
        "--out",
        out,
        "--format",
        "jsonl",
        "--model",
        "ext-model",
        "--base-url",
        f"http://127.0.0.1:{serve_session}/external/v1",
        "--config",
        write_config(tmp_path, serve_session),
    )
    serve.delete("external-policy")
    assert code == 0, output
    text = "".join(p.read_text() for p in out.glob("part-*.jsonl"))
    rows = [Trajectory.from_row(json.loads(line)) for line in text.splitlines()]
    assert sorted(t.task_id for t in rows) == ["e0", "e1", "e2", "e3"]
    assert {(t.status, t.model, t.reward) for t in rows} == {("ok", "ext-model", 1.0)}
    assert "sk-do-not-leak-42" not in text and "sk-do-not-leak-42" not in output


def test_show_prints_one_episode_as_a_conversation(tmp_path):
    from rayrollout.data.schema import FunctionCall, Message, ToolCall, Trajectory
    from rayrollout.data.writer import PartWriter, make_sink

    trajectory = Trajectory(
        task_id="math-7",
        sample_index=1,
        group_id="math-7",
        environment="math",
        reward=1.0,
        messages=[
            Message(role="user", content="What is 6 * 7?"),
            Message(
                role="assistant",
                tool_calls=[
                    ToolCall(
                        id="call_1",
                        function=FunctionCall(
                            name="calculator", arguments='{"expression": "6 * 7"}'
                        ),
                    )
                ],
            ),
            Message(role="tool", tool_call_id="call_1", name="calculator", content="42"),
            Message(role="assistant", content="The answer is \\\\boxed{42}."),
        ],
        verification={"gold": "42", "predicted": "42"},
    )
    sink = make_sink(tmp_path, "parquet", "r")
    sink.start()
    writer = PartWriter(sink, 10, 60)
    for table in writer.add([trajectory.to_row()]) + writer.drain():
        writer.write(table)
    code, output = invoke("show", tmp_path, "--task-id", "math-7", "--sample", "1")
    assert code == 0, output
    for text in (
        "What is 6 * 7?",
        "calculator",
        '{"expression": "6 * 7"}',
        "42",
        "boxed{42}",
        "reward",
        "1.000",
        "predicted",
    ):
        assert text in output
    code, output = invoke("show", tmp_path, "--task-id", "nope")
    assert code == 1 and "no trajectory of task 'nope'" in output
