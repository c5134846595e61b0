"""The sbatch launcher under a real, local, throwaway Slurm: Ray on two nodes, a collect."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from raycluster import PLACEMENT, cluster_env, free_port_block
from slurmlocal import LocalSlurm, missing_reason

pytestmark = [pytest.mark.cluster, pytest.mark.system_package("slurm")]
LAUNCHER = Path(__file__).resolve().parents[2] / "cluster" / "slurm" / "rayrollout.sbatch"


@pytest.fixture
def slurm() -> LocalSlurm:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="rrs-", dir="/tmp"))
    local = LocalSlurm(root)
    try:
        local.start()
        yield local
    finally:
        subprocess.run(["scancel", "--user=root"], env=local.env(), check=False, timeout=30)
        local.stop()
        shutil.rmtree(root, ignore_errors=True)


# The job's own wait ends before pytest's limit, so a slow job fails with its state and
# output, not a bare timeout. The job takes a minute on an idle machine, several on a busy one.
JOB_WAIT_S = 480


@pytest.mark.timeout(JOB_WAIT_S + 120)
def test_sbatch_launcher_runs_ray_on_two_nodes_and_writes_complete_output(tmp_path, slurm):
    tasks = [
        {"task_id": f"s{i}", "prompt": f"What's the weather like in Town{i}?"} for i in range(5)
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = tmp_path / "out"
    config = {
        "namespace": "slurm",
        "environment": "weather",
        "num_repeats": 2,
        "placement": PLACEMENT,
        "output": {"dir": str(out)},
        # Two Ray nodes share this host: one Serve proxy (the head's) on its own port.
        "ray": {"serve_port": free_port_block(1), "serve_proxy_location": "HeadOnly"},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    ray_tmp = Path(tempfile.mkdtemp(prefix="rrj-", dir="/tmp"))  # short: Ray's socket paths
    env = cluster_env()
    env.update(RR_PORT_BASE=str(free_port_block(100)), RR_TMP=str(ray_tmp), RR_NUM_CPUS="1")
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "job.out"
    try:
        job = slurm.submit(
            ["--nodes=2", f"--output={log}", str(LAUNCHER)]
            + ["rayrollout", "collect", "tasks.jsonl", "--config", "run.yaml"],
            env=env,
            cwd=tmp_path,
        )
        try:
            state = slurm.wait(job, timeout_s=JOB_WAIT_S)
        except TimeoutError as error:  # failed below, with the job's output
            state = str(error)
        text = log.read_text(errors="replace") if log.exists() else "(no job output)"
        assert state == "COMPLETED", f"job {job} {state}:\n{text[-4000:]}"
        assert "2 Ray node(s) up" in text
        assert "wrote 10 trajectories" in text
        assert "Ray stopped" in text
        frame = pd.read_parquet(out)
        assert len(frame) == 10 and set(frame.status) == {"ok"}
        assert sorted(zip(frame.task_id, frame.sample_index, strict=True)) == sorted(
            (f"s{i}", k) for i in range(5) for k in range(2)
        )
        leftovers = subprocess.run(
            ["pgrep", "-f", str(ray_tmp)], capture_output=True, text=True, check=False
        ).stdout.split()
        assert not leftovers, f"Ray processes left after the job: {leftovers}"
    finally:
        for pid in subprocess.run(
            ["pgrep", "-f", str(ray_tmp)], capture_output=True, text=True, check=False
        ).stdout.split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
