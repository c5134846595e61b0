"""Exactly once, whatever the user does, and hostile input as row errors: a rerun into a
folder with parts, two runs on one folder, a format switch on resume, duplicate and hostile
task rows. Each test prints the message the user sees (``pytest -s``)."""

import json
import os
import time

import pandas as pd
import pytest
from test_cli import collect, echo_tasks_file, one_error_line


def test_a_rerun_into_a_folder_with_parts_is_refused_naming_resume_and_overwrite(
    tmp_path, serve_session
):
    tasks = echo_tasks_file(tmp_path, n=3)
    code, output, out = collect(tmp_path, serve_session, tasks, "-n", "2", "--limit", "2")
    assert code == 0, output
    first = sorted(out.glob("part-*.parquet"))
    # Again without --resume: refused before anything runs; nothing is added.
    code, output, out = collect(tmp_path, serve_session, tasks, "-n", "2")
    assert code == 2
    line = one_error_line(output)
    print(f"\nRERUN {line}")
    assert line.startswith(f"error: output folder {out} already holds {len(first)} part(s)")
    assert "Pass --resume to finish that run" in line
    assert "--overwrite to delete its parts first" in line
    assert sorted(out.glob("part-*")) == first
    code, output, _ = collect(tmp_path, serve_session, tasks, "--resume", "--overwrite")
    assert code == 2 and "--resume and --overwrite exclude each other" in one_error_line(output)
    # --resume with another --format: the Parquet parts count, only the missing task runs.
    flags = ("-n", "2", "--resume", "--format", "jsonl")
    code, output, out = collect(tmp_path, serve_session, tasks, *flags)
    assert code == 0, output
    jsonl = list(out.glob("part-*.jsonl"))
    assert sum(len(p.read_text().splitlines()) for p in jsonl) == 2  # t2's two samples
    frame = read_both_formats(out)
    keys = list(zip(frame["task_id"], frame["sample_index"], strict=True))
    assert sorted(keys) == [(f"t{i}", s) for i in range(3) for s in range(2)]  # 0 duplicated
    # --overwrite: the earlier parts go, the new run's are all that is left.
    code, output, out = collect(tmp_path, serve_session, tasks, "--overwrite")
    assert code == 0, output
    frame = read_both_formats(out)
    assert sorted(frame["task_id"]) == ["t0", "t1", "t2"]
    assert not set(first) & set(out.glob("part-*")) and not list(out.glob("part-*.jsonl"))


def read_both_formats(out):
    from rayrollout import read_trajectories

    return pd.DataFrame([t.model_dump() for t in read_trajectories(out)])


def test_a_second_run_on_a_folder_being_written_is_refused_at_once(tmp_path, serve_session):
    from rayrollout import RolloutEngine

    out = tmp_path / "out"
    config = {"namespace": f"first-{tmp_path.name}", "ray": {"serve_port": serve_session}}
    with RolloutEngine({**config, "output": {"dir": str(out)}}) as first:
        first.start()  # its engine holds the folder's lock, its driver (this process) lives
        started = time.monotonic()
        code, output, _ = collect(tmp_path, serve_session, echo_tasks_file(tmp_path), "--resume")
        waited = time.monotonic() - started
    assert code == 1
    line = one_error_line(output)
    print(f"\nCONCURRENT {line}")
    assert line.startswith(f"error: another run is still writing to {out} (the writer pid ")
    assert f"started by pid {os.getpid()}" in line
    assert line.endswith("wait for it to end or stop it, or use another --out")
    assert waited < 45  # refused at once: no 60 s wait (the rest is Ray and Serve start-up)
    assert list(out.glob("part-*")) == []


def test_python_collect_refuses_an_earlier_runs_parts_but_runs_again_on_one_engine(
    tmp_path, serve_session
):
    from rayrollout import RolloutEngine
    from rayrollout.api.collect import OutputNotEmptyError

    config = {
        "namespace": f"py-{tmp_path.name}",
        "ray": {"serve_port": serve_session},
        "environments": {"echo": {"path": "fixture_envs:EchoEnv"}},
        "output": {"dir": str(tmp_path / "out")},
    }
    rows = [{"task_id": f"t{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(2)]
    with RolloutEngine(config) as engine:
        engine.collect(rows)
        engine.collect([{"task_id": "more", "prompt": "say more", "environment": "echo"}])
    with RolloutEngine(config) as engine, pytest.raises(OutputNotEmptyError) as refused:
        engine.collect(rows)
    assert isinstance(refused.value, FileExistsError)
    assert "already holds 2 part(s) of an earlier run" in str(refused.value)
    assert "resume=True or output.overwrite=True in Python" in str(refused.value)


def test_skip_invalid_rejects_hostile_rows_and_runs_the_rest(tmp_path):
    from rayrollout.api.collect import plan_collect
    from rayrollout.data.config import RunConfig

    tasks = tmp_path / "tasks.jsonl"
    lines = [
        json.dumps({"task_id": "a", "prompt": "hi", "environment": "weather"}),
        '{"prompt": "deep", "environment": "weather", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        json.dumps({"task_id": "a", "prompt": "other", "environment": "weather"}),
        json.dumps({"prompt": "hi", "environment": "weather", "sampling": {"max_tokens": 1e30}}),
        json.dumps({"task_id": "b\u0000", "prompt": "hi", "environment": "weather"}),
        json.dumps({"task_id": "c", "prompt": "hi", "environment": "weather"}),
    ]
    tasks.write_text("\n".join(lines) + "\n")
    plan = plan_collect(tasks, RunConfig.model_validate({"skip_invalid": True}))
    assert [task.task_id for task in plan.tasks] == ["a", "c"]
    reasons = [str(exc) for exc, _ in plan.rejects]
    print("\nHOSTILE " + "\nHOSTILE ".join(reasons))
    assert [exc.line for exc, _ in plan.rejects] == [2, 3, 4, 5]
    assert "nested deeper than 64 levels" in reasons[0]
    assert "task_id 'a' is also on line 1, with different content" in reasons[1]
    assert "field 'sampling.max_tokens'" in reasons[2]
    assert "field 'task_id': task_id must not contain control characters" in reasons[3]
