"""The light client on its own: it imports no Ray, reads the rows the engine writes, maps each
error status to its class, and keeps to the syntax of the oldest Python it supports.

The client against a running service is ``test_service.py``'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from rayrollout import figures
from rayrollout.client import (
    BadRequestError,
    BatchConflictError,
    BatchNotFoundError,
    EngineGoneError,
    RolloutClient,
    ServiceBusyError,
    ServiceError,
    TrajectoryRow,
    UnauthorizedError,
)
from rayrollout.client import models as wire
from rayrollout.client.models import Turn as WireTurn
from rayrollout.client.transport import raise_for_status
from rayrollout.data.schema import Message, Trajectory, Turn
from rayrollout.errors import ClusterError, InputError, RayrolloutError

ROOT = Path(__file__).resolve().parents[1]
CLIENT_SOURCES = [
    ROOT / "rayrollout/__init__.py",
    ROOT / "rayrollout/errors.py",
    ROOT / "rayrollout/auth.py",
    ROOT / "rayrollout/figures.py",
    *sorted((ROOT / "rayrollout/client").glob("*.py")),
]
HEAVY = ("ray", "pyarrow", "vllm", "torch", "pandas", "numpy", "aiohttp", "httpx2", "openai")


def test_importing_the_client_loads_no_ray_pyarrow_or_vllm():
    code = (
        "import json, sys, rayrollout.client\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert json.loads(out.stdout) == []


def test_the_client_reads_an_engine_row_and_types_what_a_trainer_reads():
    trajectory = Trajectory(
        task_id="t",
        sample_index=3,
        group_id="t",
        environment="echo",
        messages=[Message(role="user", content="hi"), Message(role="assistant", content="yo")],
        turns=[Turn(prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[-0.5])],
        reward=0.75,
        verification={"score": 3},
        policy_version=2,
    )
    trajectory.turns[0].policy_version = 2
    line = orjson.dumps(trajectory.to_row(), default=str)  # as the engine's stream encodes it
    row = TrajectoryRow.model_validate_json(line)
    assert row.key == ("t", 3) and row.reward == 0.75 and row.details() == {"score": 3}
    turn = row.turns[0]
    assert (turn.prompt_token_ids, turn.completion_token_ids, turn.logprobs) == (
        [1, 2],
        [3],
        [-0.5],
    )
    assert turn.policy_version == 2
    # Every field of the row comes through, typed or kept as it came: none is dropped.
    assert set(row.model_dump()) == set(Trajectory.model_fields)
    assert set(row.turns[0].model_dump()) == set(Turn.model_fields)
    assert set(WireTurn.model_fields) <= set(Turn.model_fields)
    assert set(TrajectoryRow.model_fields) <= set(Trajectory.model_fields)
    assert Trajectory.from_row(json.loads(line)) == trajectory  # and back, where rayrollout is


def stats_answer() -> dict:
    """A ``GET /v1/stats`` answer as the service encodes ``EngineActor.stats()``."""
    env = {"episodes": 2, "mean_reward": 0.5, "errors": 0, "close_errors": 0}
    env |= {"statuses": {"ok": 2}, "turns_per_episode": 1.0, "p50_s": 0.1, "p95_s": 0.2}
    env |= {"time_split": {"model": 1.0}, "mean_queued_s": 0.0}
    policy = {"version": 3, "paused": True, "pause_mode": "wait", "updates": 1}
    return {
        "episodes_done": 2,
        "episodes_in_flight": 0,
        "episodes_per_s": 1.5,
        "elapsed_s": 4.0,
        "mean_reward": 0.5,
        "errors": 0,
        "close_errors": 0,
        "statuses": {"ok": 2},
        "time_split": {"model": 1.0},
        "mean_queued_s": 0.0,
        "by_env": {"echo": env},
        "queued": 0,
        "rows_written": 2,
        "writer": {"parts": 1, "rows": 2, "buffered_rows": 0, "seconds": 0.1},
        "policy": policy | {"last_update": {"path": None}},
        "dynamic_sampling": {"calls": 0},
        "policy_calls": None,
    }


def test_the_clients_stats_model_is_the_engines_and_reads_a_newer_services_answer():
    assert wire.EngineStats is figures.EngineStats
    assert wire.PolicyState is figures.PolicyState
    stats = wire.EngineStats.from_answer(stats_answer())
    assert stats.policy.version == 3 and stats.policy.paused and stats["by_env"]["echo"].p95_s
    # A newer service's extra figures, at any depth, are left out rather than refused.
    newer = stats_answer() | {"new_figure": 1}
    newer["policy"]["new_state"] = "x"
    newer["by_env"]["echo"]["new_percentile"] = 0.3
    assert wire.EngineStats.from_answer(newer) == stats
    # Built in the engine, a misspelt figure still fails where it is written.
    with pytest.raises(ValueError, match="new_figure"):
        wire.EngineStats.model_validate(newer)


@pytest.mark.parametrize(
    ("status", "error", "also"),
    [
        (400, BadRequestError, InputError),
        (401, UnauthorizedError, PermissionError),
        (404, BatchNotFoundError, LookupError),
        (409, BatchConflictError, InputError),
        (429, ServiceBusyError, ServiceError),
        (500, ServiceError, RayrolloutError),
        (503, EngineGoneError, ClusterError),
    ],
)
def test_each_error_status_raises_its_class_in_rayrollouts_tree(status, error, also):
    body = json.dumps({"detail": "what went wrong", "errors": [{"row": 1}]}).encode()
    with pytest.raises(error, match="what went wrong") as caught:
        raise_for_status(status, body)
    assert isinstance(caught.value, also) and isinstance(caught.value, RayrolloutError)
    if status == 400:
        assert caught.value.errors == [{"row": 1}]


def test_no_service_at_the_url_is_engine_gone_after_the_retries():
    from netutil import free_port

    client = RolloutClient(f"http://127.0.0.1:{free_port()}", "t", retries=2, backoff_s=0.01)
    with pytest.raises(EngineGoneError, match="after 3 tries"):
        client.stats()
    with pytest.raises(EngineGoneError, match="after 3 tries"):
        list(client.stream("b"))
    with pytest.raises(ValueError, match="http"):
        RolloutClient("127.0.0.1:8321")


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_the_client_compiles_on_the_pythons_it_supports(version):
    """Syntax only: the client's venv on 3.10 (pydantic alone) is docs/how-to/service.md's."""
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} under ~/.pyenv")
    code = "import sys\nfor path in sys.argv[1:]:\n    compile(open(path).read(), path, 'exec')\n"
    subprocess.run([str(found[-1]), "-c", code, *map(str, CLIENT_SOURCES)], check=True)
