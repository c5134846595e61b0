"""A Ray that rayrollout starts holds no secrets: not the policy key, not anything that looks
like a credential, in any of its processes' environments; the driver keeps them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rayrollout.data.config import RunConfig
from rayrollout.engine import startup
from rayrollout.engine.secret_env import is_secret_name, policy_key, without_secrets

ROOT = Path(__file__).resolve().parents[1]

PLANTED = {
    "MY_POLICY_CRED": "sk-planted-policy-7d1e",  # the policy key, under a name of the config's
    "OPENAI_API_KEY": "sk-planted-openai-93ab",
    "HF_TOKEN": "hf-planted-5c2f",
    "AWS_SECRET_ACCESS_KEY": "aws-planted-0b8d",
    "SERVICE_PASSWORD": "pw-planted-44e1",
}
VISIBLE = ("RR_VISIBLE_MARKER", "visible-6a0c")  # not a secret: Ray's processes keep it
RAY = ("gcs_server", "raylet")


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("ANTHROPIC_API_KEY", True),
        ("openai_apikey", True),
        ("HF_TOKEN", True),
        ("HUGGING_FACE_HUB_TOKEN", True),
        ("GITHUB_TOKEN", True),
        ("MY_SECRET", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("AWS_REGION", True),
        ("DB_PASSWORD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("PATH", False),
        ("HOME", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("SECRETARY", False),
        ("RAY_AUTH_TOKEN", False),  # Ray's own processes need it to talk to each other
        ("RAY_ADDRESS", False),
    ],
)
def test_secret_names_follow_the_documented_rule(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_without_secrets_takes_them_away_inside_the_block_and_gives_them_back(monkeypatch):
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(*VISIBLE)
    with without_secrets(extra=["MY_POLICY_CRED"]) as taken:
        assert sorted(PLANTED) == sorted(set(taken) & set(PLANTED))
        assert not set(PLANTED) & set(os.environ)
        assert os.environ[VISIBLE[0]] == VISIBLE[1]
    assert {name: os.environ[name] for name in PLANTED} == PLANTED


def test_policy_key_is_read_from_the_configured_variable_and_prints_as_stars(monkeypatch):
    monkeypatch.setenv("MY_POLICY_CRED", PLANTED["MY_POLICY_CRED"])
    config = RunConfig.model_validate({"policy": {"api_key_env": "MY_POLICY_CRED"}})
    key = policy_key(config)
    assert key is not None and key.get_secret_value() == PLANTED["MY_POLICY_CRED"]
    assert PLANTED["MY_POLICY_CRED"] not in f"{key!r} {key}"
    monkeypatch.delenv("MY_POLICY_CRED")
    assert policy_key(config) is None


def test_ray_init_of_a_local_ray_sees_no_secrets_and_the_driver_keeps_them(monkeypatch):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(startup.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(startup.ray, "init", lambda **kw: seen.update(os.environ))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    startup.ensure_ray(RunConfig.model_validate({"policy": {"api_key_env": "MY_POLICY_CRED"}}))
    assert seen and not set(PLANTED) & set(seen)
    assert {name: os.environ[name] for name in PLANTED} == PLANTED


_PROBE = """
import json, os
from pathlib import Path
import ray
from rayrollout.data.config import RunConfig
from rayrollout.engine.startup import ensure_ray

config = RunConfig.model_validate(
    {"namespace": "scrub-test", "ray": {"num_cpus": 2}, "policy": {"api_key_env": "MY_POLICY_CRED"}}
)
ensure_ray(config)

@ray.remote(num_cpus=0)
class Probe:
    def pid(self):
        return os.getpid()

@ray.remote(num_cpus=0)
def task_pid():
    return os.getpid()

probe = Probe.remote()
workers = {ray.get(probe.pid.remote()), ray.get(task_pid.remote())}

def children():
    kids = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return kids

kids, todo, tree = children(), [os.getpid()], []
while todo:
    for kid in kids.get(todo.pop(), []):
        tree.append(kid)
        todo.append(kid)
procs = []
for pid in tree:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        continue
    procs.append({"pid": pid, "comm": comm, "environ": environ})
print("PROBE " + json.dumps({
    "driver": {name: os.environ.get(name) for name in os.environ},
    "workers": sorted(workers),
    "procs": procs,
}))
ray.shutdown()
"""


def test_every_process_of_a_local_ray_starts_without_the_drivers_secrets():
    tmpdir = Path(tempfile.mkdtemp(prefix="rr-scrub-", dir="/tmp"))
    env = {**os.environ, **PLANTED, VISIBLE[0]: VISIBLE[1], "RAY_TMPDIR": str(tmpdir)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("RAY_ADDRESS", None)
    try:
        run = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=300
        )
        assert run.returncode == 0, run.stderr[-3000:]
        line = next(x for x in run.stdout.splitlines() if x.startswith("PROBE "))
        report = json.loads(line.removeprefix("PROBE "))
        leaks = [
            (proc["comm"], name)
            for proc in report["procs"]
            for name, value in PLANTED.items()
            if value in proc["environ"]
        ]
        comms = sorted({proc["comm"] for proc in report["procs"]})
        print(f"\nSCRUB processes={len(report['procs'])} kinds={comms} leaks={len(leaks)}")
        assert leaks == []
        pids = {proc["pid"] for proc in report["procs"]}
        assert set(report["workers"]) <= pids  # the worker processes were among those read
        assert set(RAY) <= set(comms)
        # Not emptied either: the processes kept the rest of the driver's environment (a
        # process still starting may show an empty one, so the long-lived ones are checked).
        kept = [p for p in report["procs"] if p["pid"] in report["workers"] or p["comm"] in RAY]
        assert len(kept) >= 4
        assert all(f"{VISIBLE[0]}={VISIBLE[1]}" in proc["environ"] for proc in kept)
        assert {name: report["driver"].get(name) for name in PLANTED} == PLANTED
        assert files_holding(tmpdir, PLANTED.values()) == []
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def files_holding(folder: Path, secrets: Any) -> list[str]:
    """Every file under ``folder`` holding any of ``secrets``."""
    found = []
    for path in folder.rglob("*"):
        try:
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        except OSError:
            continue
        found += [str(path) for secret in secrets if secret.encode() in data]
    return found
