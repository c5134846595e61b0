"""Secrets and exposure: a planted API key reaches the policy server and nothing else (not
rows, logs, environment replicas or tool processes); the services a run starts listen on
127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from flaky_policy import FlakyPolicy
from netutil import free_port

from rayrollout.data.config import RunConfig
from rayrollout.engine import startup

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-planted-4f9c2e7a1b"


def files_holding(folder: Path, secret: str) -> list[str]:
    """Every file under ``folder`` whose bytes contain ``secret``."""
    found = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and secret.encode() in path.read_bytes():
                found.append(str(path))
        except OSError:  # sockets, files that went away
            continue
    return found


@pytest.fixture
def ray_tmpdir():
    """A short, private Ray temp folder, so the run's session logs are only its own."""
    folder = Path(tempfile.mkdtemp(prefix="rr-sec-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_planted_api_key_is_sent_to_the_policy_and_found_nowhere_else(tmp_path, ray_tmpdir):
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"task_id": f"s{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(16)]
    rows.append({"task_id": "down", "prompt": "[[always=500]] hi", "environment": "echo"})
    lines = [json.dumps(row) for row in rows]
    lines.insert(3, '{"task_id": "bad", "prompt": 42}')  # one reject for _rejects.jsonl
    tasks.write_text("\n".join(lines) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "namespace": "secrets-test",
                "environments": {"echo": {"path": "fixture_envs:EchoEnv"}},
                "policy": {"timeout_s": 1.0, "max_retries": 2},
                "ray": {"serve_port": free_port(), "num_cpus": 2},
            }
        )
    )
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OPENAI_API_KEY": KEY,
        "RAY_TMPDIR": str(ray_tmpdir),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
    }
    env.pop("RAY_ADDRESS", None)  # a local Ray of its own, with its own session logs
    with FlakyPolicy(fault_rate=0.3, seed=3, hang_s=2.0, echo_key=True) as flaky:
        command = [sys.executable, "-m", "rayrollout.cli", "collect", str(tasks)]
        command += ["--out", str(out), "-n", "2", "--skip-invalid", "--config", str(config)]
        command += ["--base-url", flaky.base_url, "--model", "flaky"]
        run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert flaky.authorization == {f"Bearer {KEY}"}  # the key was planted and really used
    assert flaky.faults_injected > 0

    frame = pd.read_parquet(out)
    keys = sorted(zip(frame["task_id"], frame["sample_index"], strict=True))
    print(f"\nFAULTS injected={flaky.faults_injected} episodes={len(keys)} rejects=1")
    assert keys == sorted((row["task_id"], s) for row in rows for s in range(2))
    down = frame[frame["task_id"] == "down"]
    assert set(down["status"]) == {"error"}
    # The server quoted the key in its error; the row carries the error with the key blanked.
    assert all("answered HTTP 500" in e and "[api key]" in e for e in down["error"])
    rejects = (out / "_rejects.jsonl").read_text()
    assert json.loads(rejects)["field"] == "prompt"

    assert KEY not in frame.to_json()
    assert KEY not in rejects
    assert KEY not in run.stdout and KEY not in run.stderr
    assert files_holding(out, KEY) == []
    sessions = list((ray_tmpdir / "ray").glob("session_*/logs"))
    assert sessions, f"no Ray session logs under {ray_tmpdir}"
    assert sum(1 for _ in sessions[0].rglob("*.log")) > 0
    assert files_holding(ray_tmpdir, KEY) == []


def test_tools_on_replicas_and_inline_read_no_policy_key_from_any_environment(tmp_path, ray_tmpdir):
    """The spy tool returns ``os.environ``, ``/proc/self/environ``, its parent's and a child's,
    and which processes define the key: the agents used the key, no tool saw it."""
    spy = {"path": "spy_envs:EnvironSpyEnv"}
    tasks = tmp_path / "tasks.jsonl"
    rows = [
        {"task_id": f"{hosting}-{i}", "prompt": "look around", "environment": f"spy-{hosting}"}
        for hosting in ("serve", "inline")
        for i in range(3)
    ]
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "namespace": "secrets-spy",
                "environments": {
                    "spy-serve": {**spy, "hosting": "serve", "replicas": 2},
                    "spy-inline": {**spy, "hosting": "inline"},
                },
                "ray": {"serve_port": free_port(), "num_cpus": 2},
            }
        )
    )
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OPENAI_API_KEY": KEY,
        "RR_VISIBLE_MARKER": "visible-6a0c",  # not a secret: every process keeps it
        "RAY_TMPDIR": str(ray_tmpdir),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
    }
    env.pop("RAY_ADDRESS", None)
    with FlakyPolicy(fault_rate=0.0) as policy:
        command = [sys.executable, "-m", "rayrollout.cli", "collect", str(tasks)]
        command += ["--out", str(out), "--config", str(config)]
        command += ["--base-url", policy.base_url, "--model", "spy"]
        run = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        stdout, stderr = run.communicate(timeout=240)
    assert run.returncode == 0, stderr[-3000:]
    assert policy.authorization == {f"Bearer {KEY}"}  # the agents had the key and used it

    frame = pd.read_parquet(out)
    assert sorted(frame["status"]) == ["ok"] * len(rows)
    reports = []
    for messages in frame["messages"]:
        messages = json.loads(messages) if isinstance(messages, str) else list(messages)
        tool_messages = [m for m in messages if m["role"] == "tool"]
        reports += [json.loads(m["content"]) for m in tool_messages]
    assert len(reports) == len(rows)
    views = ("os_environ", "self_environ", "parent_environ", "child_environ")
    for report in reports:  # the tool really read each environment: the marker is there
        assert all("visible-6a0c" in json.dumps(report[view]) for view in views), report
    holders = sorted({h for report in reports for h in report["key_holders"]})
    leaking_rows = [r for r in frame.to_dict("records") if KEY in json.dumps(r, default=str)]
    print(f"\nSPY episodes={len(reports)} rows_with_key={len(leaking_rows)} holders={holders}")
    assert leaking_rows == []
    # Only the driver (`rayrollout collect`) holds the key in its environment.
    assert [h.split(" ", 1)[0] for h in holders] == [str(run.pid)]
    assert KEY not in stdout and KEY not in stderr
    assert files_holding(out, KEY) == []
    assert list((ray_tmpdir / "ray").glob("session_*/logs/*"))
    assert files_holding(ray_tmpdir, KEY) == []


def test_local_ray_starts_without_a_dashboard_and_serve_listens_on_loopback(monkeypatch):
    started: dict[str, Any] = {}
    monkeypatch.setattr(startup.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(startup.ray, "init", lambda **kw: started.setdefault("ray", kw))
    from ray import serve  # startup imports it only on the way to starting Serve

    monkeypatch.setattr(serve, "start", lambda **kw: started.setdefault("serve", kw))
    monkeypatch.setattr(startup, "_serve_is_up", lambda: False)  # no Ray is connected here
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = RunConfig.model_validate({"ray": {"serve_port": free_port()}})
    startup.ensure_ray(config)
    startup.ensure_serve(config)
    assert started["ray"]["include_dashboard"] is False
    assert started["serve"]["http_options"]["host"] == "127.0.0.1"
