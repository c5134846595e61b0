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
import pytest
import yaml
from netutil import free_port
from trajectories import write_through
from typer.testing import CliRunner

from rayrollout.cli.commands import app

ROOT = Path(__file__).resolve().parents[1]
NEMO_GYM_TASKS = ROOT / "rayrollout" / "environments" / "weather" / "tasks_nemo_gym.jsonl"
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
    output = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback  # a crash, not an exit: show it with the output

        output += "".join(traceback.format_exception(result.exception))
    return result.exit_code, output


def collect(tmp_path, port, tasks, *flags):
    """``rayrollout collect TASKS --out tmp_path/out FLAGS`` on the session's Serve (a run
    config naming its port); returns the exit code, the output and the output folder."""
    out = tmp_path / "out"
    config = write_config(tmp_path, port)
    code, output = invoke("collect", tasks, "--out", out, *flags, "--config", config)
    return code, output, out


def test_nemo_gym_rows_run_through_collect_with_full_reward(tmp_path, serve_session):
    flags = ("--env", "weather", "--policy", "scripted")
    code, output, out = collect(tmp_path, serve_session, NEMO_GYM_TASKS, *flags)
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
    code, output, out = collect(tmp_path, serve_session, tasks, "--skip-invalid")
    assert code == 0, output
    assert sorted(pd.read_parquet(out)["task_id"]) == ["a", "c"]
    rejects = [json.loads(line) for line in (out / "_rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejects] == [(2, "prompt"), (3, None)]
    assert rejects[1]["raw"] == "not json"
    # A resume meets the same bad rows again: the rejects file keeps each one once.
    code, output, _ = collect(tmp_path, serve_session, tasks, "--skip-invalid", "--resume")
    assert code == 0, output
    again = [json.loads(line) for line in (out / "_rejects.jsonl").read_text().splitlines()]
    assert again == rejects


def test_demo_writes_scored_multi_turn_trajectories(tmp_path, serve_session):
    """Every built-in environment with example tasks, the code one where its sandbox can run
    (CI); elsewhere the demo says in one line that it left it out (test_system_packages)."""
    from rayrollout.environments.code.env import CodeEnv

    out = tmp_path / "demo"
    code, output = invoke(
        "demo", "--out", out, "-n", "2", "--config", write_config(tmp_path, serve_session)
    )
    assert code == 0, output
    frame = ds.dataset(out, format="parquet").to_table().to_pandas()
    sandbox = CodeEnv.unavailable_reason() is None
    assert set(frame["environment"]) == {"weather", "math"} | ({"code"} if sandbox else set())
    assert ("left out environment 'code'" in output) is not sandbox
    assert frame["reward"].between(0, 1).all()
    assert set(frame["status"]) == {"ok"}
    assert set(frame["worker"]) == {"worker:0"}  # one worker, as the config names none
    assert "workers: 1" in output
    for messages in frame["messages"]:
        roles = [m["role"] for m in messages]
        assert roles[-3:] == ["assistant", "tool", "assistant"]
        assert messages[-3]["tool_calls"][0]["function"]["name"]
        assert messages[-1]["content"]
    assert frame.groupby("environment")["reward"].mean().min() == 1.0


# Two runs of the CLI, each starting its own Ray: the hang guard covers both at load 50.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_resume_after_a_killed_run_writes_exactly_the_missing_rows(tmp_path, stop):
    """A real `rayrollout collect` process is SIGKILLed (or SIGTERMed: it writes what is
    finished and exits 130, as on Ctrl-C) mid-run; --resume completes it."""
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
                "ray": {"serve_port": free_port(), "num_cpus": 2},
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
        command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 200  # Ray's start alone takes minutes at load 50
        while len(list(out.glob("part-*.parquet"))) < 2:
            if process.poll() is not None:
                output = process.stdout.read() if process.stdout else ""
                raise AssertionError(
                    f"the run ended before it could be interrupted:\n{output[-3000:]}"
                )
            assert time.monotonic() < deadline, "no part file appeared in time"
            time.sleep(0.2)
        if stop == signal.SIGTERM:
            process.send_signal(signal.SIGTERM)  # the driver only, as a scheduler stops it
            output, _ = process.communicate(timeout=60)
            assert process.returncode == 130, output[-3000:]
            said = " ".join(output.split())  # as one line: the console wraps it
            assert "interrupted: writing finished episodes" in said
            assert "run again with --resume to complete" in said
    finally:
        if process.poll() is None:
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

    from rayrollout import Trajectory
    from rayrollout.auth import RouteAuth
    from rayrollout.deployments.scripted import scripted_policy_app

    # The "external" server takes only its key, as a real one would: the workers must send it.
    serve.run(
        scripted_policy_app(model="ext-model", auth=RouteAuth.bearer("sk-do-not-leak-42")),
        name="external-policy",
        route_prefix="/external",
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-do-not-leak-42")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"task_id": f"e{i}", "prompt": f"echo {i}", "environment": "echo"}) + "\n"
            for i in range(4)
        )
    )
    base_url = f"http://127.0.0.1:{serve_session}/external/v1"
    flags = ("--format", "jsonl", "--model", "ext-model", "--base-url", base_url)
    code, output, out = collect(tmp_path, serve_session, tasks, *flags)
    serve.delete("external-policy")
    assert code == 0, output
    text = "".join(p.read_text() for p in out.glob("part-*.jsonl"))
    rows = [Trajectory.from_row(json.loads(line)) for line in text.splitlines()]
    assert sorted(t.task_id for t in rows) == ["e0", "e1", "e2", "e3"]
    assert {(t.status, t.model, t.reward) for t in rows} == {("ok", "ext-model", 1.0)}
    assert "sk-do-not-leak-42" not in text and "sk-do-not-leak-42" not in output
    assert f"rayrollout.read_trajectories('{out}')" in output  # the hint fits JSONL parts
    assert "read_parquet" not in output


def test_show_prints_one_episode_as_a_conversation(tmp_path):
    from trajectories import one_tool_episode

    from rayrollout.data.writer import make_sink

    question, arguments, answer = "What is 6 * 7?", '{"expression": "6 * 7"}', "\\\\boxed{42}."
    trajectory = one_tool_episode(
        "math-7",
        "math",
        (question, "calculator", arguments, "42", f"The answer is {answer}"),
        sample_index=1,
        reward=1.0,
        verification={"gold": "42", "predicted": "42"},
        worker="worker:0",
        played_by="tool_loop",
    )
    write_through(make_sink(tmp_path, "parquet", "r"), [trajectory], 10)
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
        "tool_loop  (on worker:0)",  # the agent (episode loop), on the worker actor
    ):
        assert text in output
    code, output = invoke("show", tmp_path, "--task-id", "nope")
    assert code == 1 and "no trajectory of task 'nope'" in output


def one_error_line(output):
    """The one ``error:`` line a refused command prints (never a traceback)."""
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def echo_tasks_file(tmp_path, n=2):
    tasks = tmp_path / "tasks.jsonl"
    rows = ({"task_id": f"t{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(n))
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tasks


def test_a_missing_tasks_file_is_one_error_line_and_exit_2(tmp_path):
    code, output = invoke("collect", tmp_path / "nope.jsonl", "--out", tmp_path / "out")
    assert code == 2
    assert "tasks file not found" in one_error_line(output)


def test_an_engine_already_running_in_the_namespace_is_one_error_line_and_exit_1(
    tmp_path, serve_session
):
    from rayrollout import RolloutEngine

    namespace = f"cli-{tmp_path.name}"  # the namespace write_config gives the command
    config = {"namespace": namespace, "ray": {"serve_port": serve_session}}
    with RolloutEngine({**config, "output": {"dir": str(tmp_path / "first")}}) as first:
        first.start()
        code, output, out = collect(tmp_path, serve_session, echo_tasks_file(tmp_path))
    assert code == 1
    line = one_error_line(output)
    assert f"an engine is already running in Ray namespace '{namespace}'" in line
    assert f"rayrollout down --namespace {namespace}" in line
    assert not out.exists()


def test_an_output_folder_that_cannot_be_made_is_one_error_line_and_exit_2(tmp_path):
    """Caught before start (``api.preflight``), so no Ray is needed: the port is never used."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    tasks, config = echo_tasks_file(tmp_path), write_config(tmp_path, 1)
    code, output = invoke("collect", tasks, "--out", blocker / "out", "--config", config)
    assert code == 2
    assert f"cannot create output folder {blocker / 'out'}: {blocker} is a file" in one_error_line(
        output
    )


@pytest.mark.parametrize(
    ("old", "named"),
    [
        (
            {"agents": {"num_agents": 3, "episode_timeout_s": 9}},
            "config key 'agents' was renamed: agents.num_agents -> workers.num_workers, "
            "agents.episode_timeout_s -> episode.timeout_s",
        ),
        (
            {"agents": {"max_turns": 2}, "placement": {"spread_agents": False}},
            "config keys 'agents', 'placement.spread_agents' were renamed: agents.max_turns -> "
            "episode.max_turns, placement.spread_agents -> placement.spread_workers",
        ),
    ],
    ids=["agents", "agents-and-placement"],
)
def test_an_old_config_key_is_one_error_line_naming_its_new_key(tmp_path, old, named):
    """Refused by the config model itself, so YAML, flags and Python all get the same line;
    nothing starts (no Ray: the port is never used)."""
    tasks, config = echo_tasks_file(tmp_path), write_config(tmp_path, 1, **old)
    code, output = invoke("collect", tasks, "--out", tmp_path / "out", "--config", config)
    assert code == 2
    assert one_error_line(output) == f"error: invalid config {config}: {named}"
    assert not (tmp_path / "out").exists()

    from pydantic import ValidationError

    from rayrollout import RolloutEngine

    with pytest.raises(ValidationError, match=named.split(":")[0]):
        RolloutEngine(old)  # a Python caller's dict, validated once the same way


def test_python_collect_checks_every_row_of_a_file_before_starting_anything(tmp_path):
    from rayrollout import RolloutEngine
    from rayrollout.api.collect import InvalidTasksError

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "ok", "environment": "weather"}\n{"prompt": 7}\n')
    engine = RolloutEngine({"output": {"dir": str(tmp_path / "out")}})
    with pytest.raises(InvalidTasksError, match="1 invalid row") as caught:
        engine.collect(tasks)
    assert "tasks.jsonl line 2, field 'prompt'" in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert engine.engine is None and not (tmp_path / "out").exists()


def test_skip_invalid_and_limit_come_from_one_read_of_the_file(tmp_path, monkeypatch):
    from rayrollout.api import collect as collect_module
    from rayrollout.api.collect import plan_collect
    from rayrollout.data.config import RunConfig
    from rayrollout.data.tasks import iter_task_rows

    reads: list[list[int]] = []  # every pass over the file, and the lines it read

    def counted(path):
        reads.append([])
        for line, row, raw in iter_task_rows(path):
            reads[-1].append(line)
            yield line, row, raw

    monkeypatch.setattr(collect_module, "iter_task_rows", counted)
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"task_id": name, "prompt": "hi", "environment": "weather"} for name in "abc"]
    lines = [json.dumps(rows[0]), "not json", json.dumps(rows[1]), json.dumps(rows[2])]
    tasks.write_text("\n".join(lines) + "\n")
    config = RunConfig.model_validate({"skip_invalid": True, "limit": 2, "num_repeats": 3})
    plan = plan_collect(tasks, config)
    assert reads == [[1, 2, 3]]  # one pass, stopped at the limit: line 4 was never read
    assert [task.task_id for task in plan.tasks] == ["a", "b"]
    assert [(exc.line, raw) for exc, raw in plan.rejects] == [(2, "not json")]
    assert plan.episodes == 6
    plan.written = {("a", 0), ("b", 2)}  # what --resume finds already written
    assert plan.episodes == 4
