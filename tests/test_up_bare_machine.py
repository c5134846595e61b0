"""``rayrollout up``, ``status`` and ``down`` on a machine with no Ray cluster, as a newcomer
types them: ``up`` leaves a local Ray head and the HTTP service answering after it returns,
the service comes back by itself when its process is killed, ``status`` finds the run
without ``--config`` and never starts a Ray, and ``down`` ends everything ``up`` started.

Every command runs as its own process with a home folder of its own (the head's record, the
route token and Ray's token live there), a Ray temp folder of its own and free ports, and
without RAY_ADDRESS, so it neither joins nor disturbs another Ray on the machine (the test
session's own included). Every process the head started is recorded while it runs and, if
``down`` left one, killed by its pid at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netutil import free_port

from rayrollout.client import EngineGoneError, RolloutClient

RAYROLLOUT = Path(sys.executable).with_name("rayrollout")


@pytest.fixture
def home() -> Iterator[Path]:
    """A short home folder (Ray's socket paths must stay under 108 characters)."""
    folder = Path(tempfile.mkdtemp(prefix="rr-up-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def command(home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        return subprocess.run(
            [str(RAYROLLOUT), *args],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:  # what it printed, and the local head's log
        head_log = home / ".rayrollout" / "local-ray.log"
        log = head_log.read_text()[-3000:] if head_log.exists() else "(no head log)"
        stderr = exc.stderr or b""  # bytes, even with text=True
        stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        pytest.fail(
            f"`rayrollout {' '.join(args)}` still ran after {timeout:g} s\n"
            f"its stderr:\n{stderr[-3000:]}\nthe head's log:\n{log}"
        )


def descendants(root: int) -> dict[int, str]:
    """Every live process below ``root`` (by parent pid), with its command line."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            names[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: dict[int, str] = {}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found[child] = names.get(child, "")
            stack.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # not answering yet
            last = exc
        assert time.monotonic() < deadline, f"{what} within {timeout_s:g}s (last: {last!r})"
        time.sleep(0.5)


# A head, an engine and a service of their own: on a busy machine the head may take several
# starts (``local_head.MOST_STARTS``, each up to Ray's 30 s raylet wait and more).
@pytest.mark.timeout(900)
def test_up_on_a_bare_machine_stays_up_until_down_and_status_finds_it(home):
    service_port, serve_port = free_port(), free_port()
    (home / "run.yaml").write_text(
        json.dumps(
            {
                "namespace": "bare",
                "output": {"dir": str(home / "out")},
                "workers": {"num_workers": 1},
                "ray": {"temp_dir": str(home / "ray"), "serve_port": serve_port, "num_cpus": 2},
                "service": {"port": service_port},
            }
        )
    )
    state_file = home / ".rayrollout" / "local-ray.json"

    # No Ray is up: status says so, as JSON, exits 1 and starts nothing.
    none = command(home, "status")
    assert none.returncode == 1, none.stderr
    assert json.loads(none.stdout)["ray"] == {"up": False}
    assert not state_file.exists()

    started: dict[int, str] = {}
    head_pid = None
    try:
        up = command(home, "up", "--config", "run.yaml", timeout=720)
        assert up.returncode == 0, up.stderr[-3000:]
        answer = json.loads(up.stdout)
        url = answer["service"]["url"]
        assert url == f"http://127.0.0.1:{service_port}" and answer["engine"]["up"]
        head_pid = json.loads(state_file.read_text())["pid"]
        assert alive(head_pid)  # `up` has returned; its head has not
        started = wait_for(
            lambda: (
                (found := descendants(head_pid))
                and any("ServiceActor" in name for name in found.values())
                and found
            ),
            60,
            "the service's process under the head",
        )

        # The service answers after `up` returned: 3 tasks x 2 samples, every row once.
        token = home / ".rayrollout" / "route-tokens" / "bare"
        client = RolloutClient(url, token_file=str(token))
        tasks = [
            {"task_id": f"w{i}", "prompt": f"Weather in {city}?", "environment": "weather"}
            for i, city in enumerate(["Oslo", "Lima", "Tokyo"])
        ]
        rows = [item.trajectory for item in client.stream(client.submit(tasks, n=2).batch_id)]
        assert sorted((r.task_id, r.sample_index) for r in rows) == [
            (f"w{i}", s) for i in range(3) for s in range(2)
        ]
        assert {r.status for r in rows} == {"ok"}

        # status finds the one run without --config, and prints JSON only.
        shown = command(home, "status")
        assert shown.returncode == 0, shown.stderr[-3000:]
        listed = json.loads(shown.stdout)
        assert listed["namespace"] == "bare" and listed["service"]["url"] == url
        assert listed["ray"]["started_by_up"] and listed["ray"]["pid"] == head_pid
        assert isinstance(listed["engine"]["progress"], dict)
        assert listed["engine"]["progress"]["total"]["episodes"] >= 6

        # Killed by something other than `down`, the service comes back on its own port.
        service_pid = next(p for p, name in started.items() if "ServiceActor" in name)
        os.kill(service_pid, signal.SIGKILL)
        wait_for(lambda: not alive(service_pid), 30, "the killed service gone")
        wait_for(lambda: client.info().namespace == "bare", 120, "the service back")
        started |= descendants(head_pid)

        # down removes the run, then the head `up` started, and every process it had.
        removed = command(home, "down")
        assert removed.returncode == 0, removed.stderr[-3000:]
        assert "removed actor bare/service" in removed.stdout
        assert f"removed local Ray head (pid {head_pid}" in removed.stdout
        assert not state_file.exists()
        wait_for(
            lambda: not [p for p in [head_pid, *started] if alive(p)],
            60,
            "every process the head started ended",
        )
        after = command(home, "status")
        assert after.returncode == 1 and json.loads(after.stdout)["ray"] == {"up": False}
        # A client's error names what it saw: nothing listens at the URL any more.
        gone = RolloutClient(url, token_file=str(token), retries=1, backoff_s=0.01)
        with pytest.raises(EngineGoneError, match="ConnectionRefused.*nothing listens at"):
            gone.info()
    finally:
        if head_pid is None and state_file.exists():  # `up` failed or ran out of time
            head_pid = json.loads(state_file.read_text())["pid"]
            started |= descendants(head_pid)
        for pid in [*started, *([head_pid] if head_pid else [])]:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_up_replaces_the_engine_an_up_stopped_during_start_up_left_without_its_service(
    tmp_path, serve_session
):
    """An ``up`` killed after it started the engine and before the service leaves an
    engine alone in the namespace; ``up`` run again replaces it and starts both, and a
    third ``up`` says the run is already up (on the test session's Ray)."""
    import ray

    from rayrollout import RunConfig
    from rayrollout.api.cluster import EngineExistsError, down, start_detached, status
    from rayrollout.api.rollout_engine import RolloutEngine
    from rayrollout.engine.secret_env import route_token_path

    namespace = "half-up"
    config = RunConfig.model_validate(
        {
            "namespace": namespace,
            "output": {"dir": str(tmp_path / "out")},
            "workers": {"num_workers": 1},
            "ray": {"serve_port": serve_session},
            "service": {"port": 0},
        }
    )
    RolloutEngine(config).start(detached=True)  # where the stopped `up` got to
    left_behind = ray.get_actor("engine", namespace=namespace)._actor_id
    try:
        start_detached(config)
        state = status(namespace)
        assert state["engine"]["up"] and state["service"]["up"]
        assert ray.get_actor("engine", namespace=namespace)._actor_id != left_behind
        client = RolloutClient(state["service"]["url"], token_file=str(route_token_path(namespace)))
        task = {"task_id": "oslo", "prompt": "Weather in Oslo?", "environment": "weather"}
        rows = [item.trajectory for item in client.stream(client.submit([task], n=2).batch_id)]
        assert sorted(r.sample_index for r in rows) == [0, 1]
        assert {r.status for r in rows} == {"ok"}
        with pytest.raises(EngineExistsError, match="is already up .*rayrollout status"):
            start_detached(config)
    finally:
        down(namespace)
