"""``ray job submit ... -- rayrollout collect ...`` against the test cluster's head."""

from __future__ import annotations

import json
import subprocess
import time

import pandas as pd
import pytest
import yaml
from ray.job_submission import JobStatus, JobSubmissionClient
from raycluster import VENV_BIN, run_config

pytestmark = pytest.mark.cluster


def test_collect_submitted_with_ray_job_submit_succeeds_and_writes_every_row(
    tmp_path, ray_cluster, serve_port
):
    workdir = tmp_path / "job"
    workdir.mkdir()
    tasks = [
        {"task_id": f"w{i}", "prompt": f"What's the weather like in City{i}?"} for i in range(6)
    ]
    (workdir / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = tmp_path / "job-out"
    config = run_config(tmp_path, serve_port, "jobsubmit", output={"dir": str(out)})
    (workdir / "run.yaml").write_text(yaml.safe_dump(config))
    submit = [
        str(VENV_BIN / "ray"),
        "job",
        "submit",
        "--address",
        ray_cluster.dashboard_url,
        "--working-dir",
        str(workdir),
        "--no-wait",
        "--",
        "rayrollout",
        "collect",
        "tasks.jsonl",
        "--env",
        "weather",
        "--num-repeats",
        "2",
        "--config",
        "run.yaml",
    ]
    env = ray_cluster.env()
    submitted = subprocess.run(
        submit, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    job_id = next(
        word.strip("'\"")
        for line in submitted.stdout.splitlines()
        for word in line.split()
        if word.strip("'\"").startswith("raysubmit_")
    )
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    status = JobStatus.PENDING
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not status.is_terminal():
        time.sleep(2)
        status = client.get_job_status(job_id)
    logs = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, f"job {job_id}: {status}\n{logs[-3000:]}"
    assert "wrote 12 trajectories" in logs
    frame = pd.read_parquet(out)
    assert len(frame) == 12
    assert sorted(zip(frame.task_id, frame.sample_index, strict=True)) == sorted(
        (f"w{i}", s) for i in range(6) for s in range(2)
    )
    assert set(frame.status) == {"ok"} and set(frame.reward) == {1.0}
