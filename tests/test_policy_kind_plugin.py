"""A policy kind from a package outside rayrollout: one folder (``tests/thin_policy_kind``)
and one entry point, registered as ``pip install`` would (a ``dist-info`` folder on the
path), runs ``rayrollout collect`` end to end; its own settings are checked by its model,
and its cross-field check by its model's validator, before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rayrollout.api.preflight import check_policy_kind
from rayrollout.data.config import ConfigError, RunConfig
from rayrollout.policy import kinds
from rayrollout.policy.kinds import UnknownPolicyKindError, policy_kind, policy_kinds

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
REPLY = "the thin kind answers this"


def write_distribution(site: Path) -> Path:
    """What ``pip install`` leaves for a package that registers the thin kind: its
    ``dist-info`` with the entry point (the code itself is ``tests/thin_policy_kind``)."""
    info = site / "thin_policy_kind-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thin-policy-kind\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rayrollout.policies]\nthin = thin_policy_kind.kind:THIN\n"
    )
    return site


@pytest.fixture
def thin_installed(tmp_path, monkeypatch):
    """The thin kind's distribution on this process's path, the kinds found afresh; both
    taken back afterwards, so no other test sees the kind."""
    monkeypatch.syspath_prepend(str(write_distribution(tmp_path / "site")))
    kinds.POLICY_KINDS.clear()
    yield
    kinds.POLICY_KINDS.clear()


def thin_policy(**settings):
    return {"kind": "thin", "model": "thin", "reply": REPLY, **settings}


def test_a_kind_from_a_package_outside_rayrollout_is_found_by_its_entry_point(thin_installed):
    from thin_policy_kind import THIN, ThinSettings

    assert policy_kinds()["thin"] == "thin_policy_kind.kind:THIN"
    assert policy_kind("thin") is THIN
    config = RunConfig.model_validate({"policy": thin_policy(served_model="thin")})
    assert check_policy_kind(config).kind is THIN
    assert kinds.kind_settings(config, ThinSettings).reply == REPLY


def test_nothing_in_rayrollout_names_the_outside_kind():
    """The kind needs no line of rayrollout: no module, pyproject.toml or doc names it."""
    places = [*ROOT.joinpath("rayrollout").rglob("*.py"), ROOT / "pyproject.toml"]
    assert not [p for p in places if "thin_policy_kind" in p.read_text()]


def test_a_kinds_own_settings_are_checked_by_its_model_before_anything_starts(thin_installed):
    from rayrollout import RolloutEngine

    with pytest.raises(
        ConfigError, match=r"policy\.replyy: not a setting of policy kind 'thin'"
    ) as e:
        RolloutEngine({"policy": thin_policy(replyy="typo")})
    assert "its own settings: reply, served_model" in str(e.value)
    assert "Did you mean 'reply'?" in str(e.value)
    missing = {"kind": "thin", "model": "thin"}
    with pytest.raises(ConfigError, match=r"policy\.reply: Field required"):
        RolloutEngine({"policy": missing})
    with pytest.raises(ConfigError, match=r"policy: kind 'thin' serves model 'thin'.*'other'"):
        RolloutEngine({"policy": thin_policy(model="other")})


def test_another_kinds_settings_are_refused_by_name(thin_installed):
    config = RunConfig.model_validate({"policy": thin_policy(vllm_config="cpu.yaml")})
    with pytest.raises(ConfigError, match=r"policy\.vllm_config: not a setting of policy kind"):
        check_policy_kind(config)
    openai = RunConfig.model_validate({"policy": {"kind": "openai", "reply": REPLY}})
    with pytest.raises(ConfigError, match="its own settings: none"):
        check_policy_kind(openai)


def test_an_unknown_kind_names_the_registered_ones_and_the_nearest(thin_installed):
    config = RunConfig.model_validate({"policy": {"kind": "thn"}})
    with pytest.raises(UnknownPolicyKindError) as raised:
        check_policy_kind(config)
    message = str(raised.value)
    assert "unknown policy kind 'thn' (did you mean 'thin'?)" in message
    assert "Registered: openai, scripted, thin, vllm" in message
    assert "'rayrollout.policies' entry point" in message


def test_collect_runs_end_to_end_with_a_kind_from_outside_rayrollout(tmp_path):
    """A real ``rayrollout collect`` process, its Ray and workers seeing the package the
    way an installed one is seen (on the path, with its dist-info): every episode is
    answered by the kind's server with the kind's own ``reply`` setting."""
    site = write_distribution(tmp_path / "site")
    tasks = tmp_path / "tasks.jsonl"
    rows = ({"task_id": f"t{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(3))
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "namespace": f"thin-{os.getpid()}",
                "policy": thin_policy(),
                "environments": {"echo": {"path": "fixture_envs:EchoEnv"}},
                "workers": {"num_workers": 1},
                "ray": {"num_cpus": 2},
            }
        )
    )
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(site), str(TESTS), env.get("PYTHONPATH")])
    )
    command = [sys.executable, "-m", "rayrollout.cli", "collect", str(tasks), "--out", str(out)]
    done = subprocess.run(
        [*command, "-n", "2", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    from rayrollout import read_trajectories

    trajectories = list(read_trajectories(out))
    assert len(trajectories) == 6
    for trajectory in trajectories:
        assert trajectory.status == "ok", trajectory.error
        assert trajectory.model == "thin"
        assert trajectory.messages[-1].role == "assistant"
        assert trajectory.messages[-1].content == REPLY  # the kind's own setting, in effect
        assert trajectory.reward == 1.0
