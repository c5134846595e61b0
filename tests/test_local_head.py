"""The local Ray head ``up`` starts: a ``ray start`` that ends on Ray's own fixed wait for its
raylet (a busy machine) is started again, a bounded number of times; any other ending is
reported with its log.

The first start is a process that prints Ray's own error and ends, as ``ray start`` does when
its raylet misses the wait; the second is the real ``ray start --head``, in a home and temp
folder of its own, ended by its process group at the end.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netutil import free_port

from rayrollout.data.config import RunConfig
from rayrollout.engine import local_head
from rayrollout.engine.errors import LocalHeadError

RAY_ERROR = (
    "Exception: The current node timed out during startup. This could happen because some "
    "of the raylet failed to startup or the GCS has become overloaded."
)
DASHBOARD_ERROR = "ERROR services.py:1424 -- Failed to start the dashboard , return code None"
GCS_ERROR = (
    "ray.exceptions.RaySystemError: System error: Failed to connect to GCS. Please check if "
    "the GCS server is running and if this node can connect to the head node."
)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short home and Ray temp folder of the test's own (socket paths stay short)."""
    folder = Path(tempfile.mkdtemp(prefix="rr-head-", dir="/tmp"))
    monkeypatch.setenv("HOME", str(folder))
    yield folder
    head = local_head.find_head()
    if head is not None:
        local_head.stop_head(head)
    shutil.rmtree(folder, ignore_errors=True)


def failing_spawn(log_text: str, stays: bool = False) -> Any:
    """A ``_spawn`` whose head is a process that logs ``log_text`` and ends, as ``ray start``
    does when it gives up (``stays``: a process that stays up, as ``ray start`` may after
    its dashboard wait, with ``log_text`` in its log before it starts: a busy machine's
    slow interpreter start must not decide what the log shows at the deadline)."""

    def spawn(config: RunConfig, env: dict[str, str]) -> Any:
        log_path = local_head.head_state_path().with_name("local-ray.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(log_text + "\n" if stays else "")
        command = ["sleep", "600"] if stays else [sys.executable, "-c", f"print({log_text!r})"]
        with open(log_path, "a") as output:
            process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        head = local_head.LocalHead(
            pid=process.pid,
            temp_dir=config.ray.temp_dir or "",
            log=str(log_path),
            started_at=time.time(),
        )
        local_head._write_state(head)
        return head, process

    return spawn


def config_for(home: Path) -> RunConfig:
    return RunConfig.model_validate(
        {"ray": {"num_cpus": 1, "head_port": free_port(), "temp_dir": str(home / "ray")}}
    )


def head_env(home: Path) -> dict[str, str]:
    """The head's environment as ``up`` gives it: no cluster to join, Ray's token
    authentication on, with a token file of the test's own home (the session's own Ray
    may have set ``RAY_AUTH_MODE`` in this process, with its token in the real home)."""
    token = home / ".ray" / "auth_token"
    token.parent.mkdir(mode=0o700, exist_ok=True)
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and "AUTH" not in k}
    return env | {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
    }


@pytest.mark.timeout(900)  # a busy machine may need every start (``MOST_STARTS``)
def test_a_head_that_missed_rays_raylet_wait_is_started_again(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_spawn = local_head._spawn
    starts: list[str] = []

    def spawn(config: RunConfig, env: dict[str, str]) -> Any:
        starts.append("failing" if not starts else "real")
        if len(starts) == 1:
            return failing_spawn(RAY_ERROR)(config, env)
        return real_spawn(config, env)

    monkeypatch.setattr(local_head, "_spawn", spawn)
    head = local_head.start_or_join_head(config_for(home), head_env(home))
    # A busy machine can make a real start miss the wait too: it is started again as well.
    assert starts[:2] == ["failing", "real"]
    assert set(starts[1:]) == {"real"} and len(starts) <= local_head.MOST_STARTS
    assert head.address and head.alive()
    assert local_head.find_head() == head  # the record names the head that came up


@pytest.mark.parametrize("ray_error", [RAY_ERROR, GCS_ERROR], ids=["raylet", "gcs"])
def test_a_head_that_keeps_missing_a_start_up_wait_is_given_up_after_the_last_start(
    ray_error: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[int] = []
    failing = failing_spawn(ray_error)

    def spawn(config: RunConfig, env: dict[str, str]) -> Any:
        spawned.append(1)
        return failing(config, env)

    monkeypatch.setattr(local_head, "_spawn", spawn)
    with pytest.raises(LocalHeadError, match=rf"ended: {re.escape(ray_error)} \(log: "):
        local_head.start_or_join_head(config_for(home), head_env(home))
    assert len(spawned) == local_head.MOST_STARTS
    assert local_head.find_head() is None


def test_a_ray_start_not_up_in_time_after_its_dashboard_wait_is_started_again_and_none_is_left(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[int] = []
    failing = failing_spawn(DASHBOARD_ERROR, stays=True)

    def spawn(config: RunConfig, env: dict[str, str]) -> Any:
        head, process = failing(config, env)
        spawned.append(head.pid)
        return head, process

    monkeypatch.setattr(local_head, "_spawn", spawn)
    monkeypatch.setattr(local_head, "HEAD_START_TIMEOUT_S", 1.0)
    match = rf"was not up after 1s: {re.escape(DASHBOARD_ERROR)} \(log: "
    with pytest.raises(LocalHeadError, match=match):
        local_head.start_or_join_head(config_for(home), head_env(home))
    assert len(spawned) == local_head.MOST_STARTS
    # Each `ray start` left up with no head behind it is stopped, the last one too.
    assert [local_head.group_members(pid) for pid in spawned] == [[]] * len(spawned)
    assert local_head.find_head() is None


def test_a_head_that_ended_for_another_reason_is_reported_with_its_log(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_head, "_spawn", failing_spawn("ValueError: port in use"))
    with pytest.raises(LocalHeadError, match=r"ended: ValueError: port in use \(log: "):
        local_head.start_or_join_head(config_for(home), head_env(home))
    assert local_head.find_head() is None
