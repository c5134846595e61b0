"""A trainer without Ray, on another Python, driving a real vLLM engine over HTTP.

``rayrollout up`` (the command, in its own process, joining the test session's Ray) starts a
detached engine and the HTTP rollout service whose policy is the tier's shared tiny-model
app (``tiny_vllm``, tests/vllm/conftest.py): policy kind 'vllm' with ``base_url`` set, so
the run deploys nothing and sends its weight updates to that app's control routes, with the
app's token as its policy key. ``rayrollout status`` gives the service's address and token
file. The trainer (``http_trainer.py``) runs on the oldest Python the client supports (3.10;
else 3.12 or 3.13 from pyenv) in a venv holding only the light client (``pip install
./clients/python``, pydantic its one dependency; built once per test session): it submits
TASKS x 4 samples, reads every trajectory from the stream with token ids and policy
versions, pauses, pushes a checkpoint by path (the served model's logprobs move: the path
reached vLLM), resumes, and reads a batch under the new version. It starts nothing: the
cluster's actors and Serve apps are the same before and after it ran. The module loads the
app's first weights back at its end, for the tier's other tests of that app.

``RAYROLLOUT_SERVICE_VLLM_TASKS`` sets TASKS (1000 by default: 4,000 trajectories).
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
from vllm_tier import ROOT, TinyVllm, client_policy, gap

from rayrollout.data.config import RunConfig

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

NAMESPACE = "service-vllm"
TASKS = int(os.environ.get("RAYROLLOUT_SERVICE_VLLM_TASKS", "1000"))
N = 4
REPLICAS = (
    2  # the shared app's (rayrollout/deployments/vllm/cpu.yaml): every one takes the checkpoint
)
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
    # symlinks=True: a checkout may link deployments/ or environments/ in; the client's
    # packages (rayrollout, rayrollout.client, rayrollout.integrations) never follow them.
    shutil.copytree(ROOT / "rayrollout", tree / "rayrollout", ignore=skip, symlinks=True)
    venv = work / "venv"
    started = time.perf_counter()
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    done = subprocess.run(
        [*pip, "install", str(tree / "clients/python")],
        timeout=600,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\nclient venv ({python.name}) built in {time.perf_counter() - started:.0f}s")
    return venv / "bin/python"


def cli(*args: str, timeout: float = 900) -> str:
    """A ``rayrollout`` command joining the test session's Ray; its standard output."""
    address = ray.get_runtime_context().gcs_address
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        # `-m`, not the venv's script: the tier may run in a venv layered over .venv-vllm
        [sys.executable, "-m", "rayrollout.cli", *args, "--address", address],
        env=env,
        cwd=ROOT,  # the digits environment is examples.grpo_loop's
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def service(tiny_vllm: TinyVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`rayrollout up` on the shared tiny app (kind 'vllm' at its URL), then `status`; at
    the end the app's first weights again, then `down` (which leaves the app: not this
    namespace's)."""
    from rayrollout.api.cluster import down, lookup_engine

    work = tmp_path_factory.mktemp("service-vllm")
    config = RunConfig.model_validate(
        {
            "namespace": NAMESPACE,
            # Sets the variable the key is read from (client_policy): `up` inherits it.
            "policy": client_policy(tiny_vllm, kind="vllm", max_tokens=8),
            "environments": {"digits": {"path": "examples.grpo_loop:DigitsEnv"}},
            "workers": {"num_workers": 1},
            "episode": {"max_turns": 1},
            "concurrency": 64,
            "training": {"pause_mode": "abort_and_retry"},
            "output": {"dir": str(work / "rollouts")},
            "ray": {"serve_port": tiny_vllm.serve_port},
        }
    )
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    started = time.perf_counter()
    try:
        cli("up", "--config", str(path))
        print(f"\n`rayrollout up` on the shared vLLM app: {time.perf_counter() - started:.0f}s")
        assert f"{NAMESPACE}.policy" not in cluster_contents()[1]  # it deployed no vLLM
        status = json.loads(cli("status", "--namespace", NAMESPACE))
        yield {"status": status["service"], "tiny": tiny_vllm}
    finally:
        try:
            engine = lookup_engine(NAMESPACE)
            update = ray.get(engine.update_weights.remote(str(tiny_vllm.model_path)), timeout=600)
            assert update["replicas"] == REPLICAS, update
            # A trainer that failed while paused left vLLM paused: the app is shared.
            ray.get(engine.resume.remote(), timeout=600)
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


PROBE_IDS = list(range(100, 132))  # a fixed token sequence the served model scores


def served_logprobs(tiny: TinyVllm) -> list[list[float]]:
    """The served model's logprobs of PROBE_IDS, twice (either replica may answer one)."""
    return tiny.prompt_logprobs(PROBE_IDS, tries=2)


def cluster_contents() -> tuple[set[tuple[str, str]], set[str]]:
    from ray import serve

    named = {(a["namespace"], a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)}
    return named, set(serve.status().applications)


def test_a_trainer_on_another_python_without_ray_drives_vllm_through_the_service(
    service, client_python, tmp_path
):
    tiny = service["tiny"]
    checkpoint = perturbed_checkpoint(tiny.model_path, tmp_path / "step-1")
    served_before = served_logprobs(tiny)
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
    served_after = served_logprobs(tiny)
    noise = gap(*served_before)
    moved = min(gap(a, b) for a in served_after for b in served_before)
    print(
        f"\n{json.dumps(report, indent=1)}\nserved logprobs moved {moved:.3f} (noise {noise:.4f})"
    )

    assert report["python"].split(".")[:2] != [str(sys.version_info[0]), str(sys.version_info[1])]
    assert not report["ray_installed"] and report["heavy_modules"] == []
    assert report["installed"] == [], report["installed"]  # no ray, pyarrow, vllm in its venv
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
    assert report["update"]["replicas"] == REPLICAS and report["update"]["backend"] == "vllm"
    # ...and the checkpoint reached vLLM: the served model scores a fixed sequence otherwise.
    assert moved > max(0.05, 10 * noise), (moved, noise)
    assert second["rows"] == second["distinct"] == 8 * N
    assert second["turn_versions"] == {str(version + 1): 8 * N}
    assert second["turns_without_token_ids"] == 0
