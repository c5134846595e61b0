"""``export nemo-gym`` as NeMo Gym 0.7.0's own code reads it: its models, profiler, health checks.

A real collect (scripted policy on Serve; NeMo Gym weather rows and rayrollout math rows, plus
a task whose every policy call times out, 2 samples each) is exported, and NeMo Gym's venv
reads the three files: its pydantic models validate every row from its JSON text (as its
servers parse requests), its failure-sidecar reader and ``count_failure_classes_as_zero``
selection find the failed episodes, ``ng_reward_profile`` profiles the rollouts against the
materialized inputs, and ``gym eval health-check`` finds nothing unhealthy.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.exports import collect_run, invoke, real_task_lines

# Every policy call of this task outlasts the policy timeout below: both samples fail.
SLOW_TASK = {
    "task_id": "math-slow",
    "environment": "math",
    "prompt": "What is 1 + 1? [[sleep=6]]",
    "expected_answer": "2",
}

# Run in NeMo Gym's venv: validate each file's rows with its models and read the failures
# file as its aggregation does; print what was found as JSON.
VALIDATE = """
import json, sys
from pathlib import Path
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.failure_kinds import is_registered
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.path_utils import failures_path_for, materialized_path_for
from nemo_gym.rollout_collection import _failure_rows_counted_as_zero, _latest_failure_rows

out = Path(sys.argv[1])
keys = lambda rows: sorted([r["_ng_task_index"], r["_ng_rollout_index"]] for r in rows)
rollouts = []
for line in out.read_text().splitlines():
    BaseVerifyResponse.model_validate_json(line)
    rollouts.append(json.loads(line))
inputs = []
for line in materialized_path_for(out).read_text().splitlines():
    BaseRunRequest.model_validate_json(line)
    inputs.append(json.loads(line))
failures = [json.loads(line) for line in failures_path_for(out).read_text().splitlines()]
for row in failures:
    NeMoGymResponse.model_validate(row["_ng_failure_partial_response"])
classes = sorted({row["_ng_failure_class"] for row in failures})
counted = _failure_rows_counted_as_zero([failures_path_for(out)], classes, set())
print(json.dumps({
    "rollouts": keys(rollouts),
    "inputs": keys(inputs),
    "failures": keys(failures),
    "registered": {c: is_registered(c) for c in classes},
    "sidecar": sorted(list(k) for k in _latest_failure_rows([failures_path_for(out)])),
    "counted": sorted([r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]] for r in counted),
}))
"""


def ng(ng_python: Path, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command of NeMo Gym's venv (``python`` or one of its CLIs) in ``cwd``.

    Without our PYTHONPATH (the test session's, for Ray's workers): it names rayrollout's
    checkout, whose top-level packages would shadow NeMo Gym's own.
    """
    env = {**os.environ, "VIRTUAL_ENV": str(ng_python.parent.parent)}
    env["PATH"] = f"{ng_python.parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    command = [str(ng_python.parent / str(args[0])), *map(str, args[1:])]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, serve_session: int) -> dict[str, Any]:
    """The export of a real run with failed episodes: its rollouts file and what it holds."""
    base = tmp_path_factory.mktemp("ng-export")
    lines = [*real_task_lines(), json.dumps(SLOW_TASK)]
    run = collect_run(base, lines, serve_session, policy={"timeout_s": 2.0, "max_retries": 0})
    out = base / "gym" / "rollouts.jsonl"
    code, output = invoke("export", "nemo-gym", run, out)
    assert code == 0, output
    assert f"wrote 8 nemo-gym row(s) to {out} (10 trajectories read" in " ".join(output.split())
    failures = [json.loads(line) for line in (out.parent / "rollouts_failures.jsonl").open()]
    return {"out": out, "failures": failures}


def test_the_failures_file_holds_the_failed_episodes(exported: dict[str, Any]) -> None:
    failures = exported["failures"]
    assert sorted((f["task_id"], f["_ng_rollout_index"]) for f in failures) == [
        ("math-slow", 0),
        ("math-slow", 1),
    ]
    for row in failures:
        assert row["_ng_failure_class"] == "agent_timeout"
        assert "timed out" in row["_ng_failure_message"]
        assert "reward" not in row and row["_ng_environment_server"] == "math"
    rollouts = exported["out"].read_text()
    assert "math-slow" not in rollouts and len(rollouts.splitlines()) == 8


def test_nemo_gym_models_validate_every_row_and_its_aggregation_reads_the_failures(
    exported: dict[str, Any], ng_python: Path, tmp_path: Path
) -> None:
    result = ng(ng_python, "python", "-c", VALIDATE, exported["out"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    slow = sorted([f["_ng_task_index"], f["_ng_rollout_index"]] for f in exported["failures"])
    assert len(found["rollouts"]) == 8
    # Every episode's input row, each under its own key (the export refuses a key twice).
    assert found["inputs"] == sorted(found["rollouts"] + slow)
    assert found["failures"] == found["sidecar"] == slow
    assert found["registered"] == {"agent_timeout": True}  # NeMo Gym's shared vocabulary
    # Asked to (count_failure_classes_as_zero), its aggregation scores them as zeros.
    assert found["counted"] == [[task, rollout, 0.0] for task, rollout in slow]


def test_ng_reward_profile_profiles_the_rollouts_against_the_materialized_inputs(
    exported: dict[str, Any], ng_python: Path, tmp_path: Path
) -> None:
    out = exported["out"]
    args = [
        f"+materialized_inputs_jsonl_fpath={out.with_name('rollouts_materialized_inputs.jsonl')}",
        f"+rollouts_jsonl_fpath={out}",
    ]
    # As for NeMo Gym's own runs with failures: the failed episodes are the missing rollouts.
    partial = ng(ng_python, "ng_reward_profile", *args, cwd=tmp_path)
    assert partial.returncode != 0
    slow = sorted((f["_ng_task_index"], f["_ng_rollout_index"]) for f in exported["failures"])
    assert f"Missing rollout keys: {slow}" in partial.stderr + partial.stdout
    result = ng(
        ng_python, "ng_reward_profile", *args, "++allow_partial_rollouts=True", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "Reward profile completion: 8/10 rollout rows" in result.stdout
    agents = json.loads(out.with_name("rollouts_agent_metrics.json").read_text())
    by_name = {a["agent_ref"]["name"]: a for a in agents}
    # NeMo Gym rows under their own agent_ref; rayrollout rows under their environment.
    assert set(by_name) == {"weather_simple_agent", "math"}
    assert by_name["weather_simple_agent"]["mean/reward"] == 1.0
    assert by_name["math"]["mean/reward"] == 1.0
    # One group per task that has rollouts (the slow one has none), each with both samples.
    groups = [json.loads(line) for line in out.with_name("rollouts_reward_profiling.jsonl").open()]
    verified = {json.loads(line)["task_id"] for line in out.open()}
    assert sorted(g["sample"]["task_id"] for g in groups) == sorted(verified)
    assert {(g["num_rollouts"], g["expected_num_rollouts"]) for g in groups} == {(2, 2)}


def test_rollout_health_checks_find_nothing_unhealthy(
    exported: dict[str, Any], ng_python: Path, tmp_path: Path
) -> None:
    out = exported["out"]
    args = ["eval", "health-check", out.parent, "--rollouts-file", out.name, "--workers", "1"]
    result = ng(ng_python, "gym", *args, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])["run"]
    assert summary["artifacts"]["records"] == 8
    assert summary["verdicts"]["unhealthy"] == 0
    assert not any(summary["issues"].values()), summary["issues"]
    # The record checks ran on every row. The rest read NeMo Gym's model-call capture
    # (``ng_trajectory``), which its collection writes only with observability on, and
    # report "unobserved" without it, as for its own runs.
    coverage = summary["artifacts"]["coverage"]
    for check in ("record_unreadable", "rollout_duplicate_identity", "check_execution_error"):
        assert coverage[check]["evaluated"] == 8, (check, coverage[check])
    assert summary["verdicts"]["unobserved"] == 8
