"""The rollout service across a dead engine: the real engine killed in the middle of a batch
(``ray.kill``), brought back as ``rayrollout up --resume`` brings it back, over the same
output folder, while a client streams the batch with the light client.

Counted by ``(task_id, sample_index)``: every sample reaches the client exactly once, in
cursor order with no gap; the rows finished before the kill are answered as they were (from
the service's memory, or from the batch's journal in the folder when the service died too),
never played again; and the folder ends with each sample written once, the rows the dead
engine had not yet put in a part included.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray
from netutil import free_port

from rayrollout import RunConfig
from rayrollout.api.cluster import down, service_url, start_detached
from rayrollout.api.service.journal import OpenJournalsError, journal_root
from rayrollout.api.service.service_actor import SERVICE_NAME
from rayrollout.auth import read_token_file
from rayrollout.client import RolloutClient
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Trajectory
from rayrollout.engine.engine_actor import ENGINE_NAME
from rayrollout.engine.secret_env import route_token_path

TASKS, N = 20, 2
KILL_AFTER = 10  # rows the client has read when the engine is killed...
UNREAD = 4  # ...while the service holds at least this many more, finished and unread


def config_for(namespace: str, out: Path, serve_port: int, port: int = 0) -> RunConfig:
    return RunConfig.model_validate(
        {
            "namespace": namespace,
            "environments": {"sleepy": {"path": "fixture_envs:SleepyEnv"}},
            "environment": "sleepy",
            "workers": {"num_workers": 1},
            "concurrency": 4,
            # Rows stay in the engine's writer until it is killed: the folder has none of
            # them then, and only the batch's journal can put them there.
            "output": {"dir": str(out), "rows_per_part": 1000, "flush_interval_s": 600},
            "ray": {"serve_port": serve_port},
            "service": {"port": port, "max_buffered_rows": 16},
        }
    )


def tasks(prefix: str) -> list[dict[str, Any]]:
    return [
        {"task_id": f"{prefix}-{i}", "prompt": f"note {prefix} {i}", "sleep_s": 0.15}
        for i in range(TASKS)
    ]


def expected(prefix: str) -> Counter[tuple[str, int]]:
    return Counter((f"{prefix}-{i}", s) for i in range(TASKS) for s in range(N))


def wait_for(check: Any, what: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def engine_gone(namespace: str) -> bool:
    try:
        engine = ray.get_actor(ENGINE_NAME, namespace=namespace)
    except ValueError:
        return True
    try:
        ray.get(engine.info.remote(), timeout=5)
    except Exception:
        return True
    return False


def rows_waiting(client: RolloutClient, batch_id: str) -> None:
    """Until the service holds finished rows the client has not read yet: those must come
    after the restart from what the service kept, not from a second run."""
    wait_for(lambda: client.batch(batch_id).finished >= KILL_AFTER + UNREAD, "unread rows")


def restart_later(config: RunConfig, errors: list[BaseException]) -> threading.Thread:
    """``rayrollout up --resume``, once the dead engine's name is free, in a thread."""

    def run() -> None:
        try:
            wait_for(lambda: engine_gone(config.namespace), "the engine to be gone")
            start_detached(config.model_copy(update={"resume": True}))
        except BaseException as exc:  # the test's thread reports it
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def check_the_folder(out: Path, prefix: str, before: dict[tuple[str, int], Any]) -> None:
    """Each sample written once; those finished before the kill as the client got them."""
    written: dict[tuple[str, int], list[Trajectory]] = {}
    for row in RunFolder(out).trajectories():
        written.setdefault((row.task_id, row.sample_index), []).append(row)
    assert Counter({key: len(rows) for key, rows in written.items()}) == expected(prefix)
    for key, streamed in before.items():
        (row,) = written[key]
        assert row.created_at == streamed.created_at  # the same episode, not a replay
        assert [m.content for m in row.messages] == [m["content"] for m in streamed.messages]


def test_an_engine_killed_mid_batch_comes_back_and_each_sample_reaches_the_client_once(
    tmp_path, serve_session
):
    """The service lives on: it keeps the batch's rows; the client's stream ends saying the
    engine died, sends the batch again until `up --resume` has a new engine up, and goes on
    from its cursor."""
    namespace = "svc-restart-engine"
    config = config_for(namespace, tmp_path / "out", serve_session)
    start_detached(config)
    errors: list[BaseException] = []
    restart: threading.Thread | None = None
    try:
        url, token = service_url(namespace), read_token_file(route_token_path(namespace))
        assert url is not None
        client = RolloutClient(url, token, retries=3, backoff_s=0.1, restart_wait_s=180)
        batch = client.submit(tasks("e"), n=N, write=True, batch_id="step-0")
        items, finished_at_kill = [], 0
        for item in client.stream(batch.batch_id):
            items.append(item)
            if len(items) == KILL_AFTER:
                rows_waiting(client, "step-0")
                ray.kill(ray.get_actor(ENGINE_NAME, namespace=namespace))
                status = wait_for(
                    lambda: (s := client.batch("step-0")).engine_gone and s, "engine_gone"
                )
                finished_at_kill = status.finished
                restart = restart_later(config, errors)
        assert restart is not None
        restart.join(timeout=120)
        assert not errors, errors
        stats = client.stats()
        ray.get(ray.get_actor(ENGINE_NAME, namespace=namespace).flush.remote())
    finally:
        down(namespace)

    print(f"\nengine killed at {finished_at_kill} of {TASKS * N} rows: {stats.episodes_done} rerun")
    got = Counter(item.trajectory.key for item in items)
    assert got == expected("e")  # 0 lost, 0 duplicated
    assert [item.cursor for item in items] == list(range(TASKS * N))
    assert KILL_AFTER + UNREAD <= finished_at_kill < TASKS * N
    # The new engine ran exactly the samples without a row: none finished before the kill.
    assert stats.episodes_done == TASKS * N - finished_at_kill
    before = {item.trajectory.key: item.trajectory for item in items[:finished_at_kill]}
    check_the_folder(tmp_path / "out", "e", before)
    assert not (journal_root(tmp_path / "out") / "step-0").exists()  # settled: forgotten


def test_a_service_killed_with_its_engine_reads_the_batch_back_from_its_journal(
    tmp_path, serve_session
):
    """Engine and service both killed: `up` without --resume refuses the folder's unfinished
    batch; `up --resume` starts both on the same port, and the client's stream (which sends
    the batch again) gets the journaled rows under their cursors and the rest as they run."""
    namespace = "svc-restart-both"
    out = tmp_path / "out"
    config = config_for(namespace, out, serve_session, port=free_port())
    start_detached(config)
    errors: list[BaseException] = []
    restart: threading.Thread | None = None
    try:
        url, token = service_url(namespace), read_token_file(route_token_path(namespace))
        assert url is not None
        client = RolloutClient(url, token, retries=2, backoff_s=0.1, restart_wait_s=180)
        batch = client.submit(tasks("b"), n=N, write=True, batch_id="step-1")
        items, journaled = [], 0
        for item in client.stream(batch.batch_id):
            items.append(item)
            if len(items) == KILL_AFTER:
                rows_waiting(client, "step-1")
                ray.kill(ray.get_actor(SERVICE_NAME, namespace=namespace))
                ray.kill(ray.get_actor(ENGINE_NAME, namespace=namespace))
                wait_for(lambda: engine_gone(namespace), "the engine to be gone")
                rows = journal_root(out) / "step-1" / "rows.jsonl"
                journaled = rows.read_bytes().count(b"\n")
                with pytest.raises(OpenJournalsError, match="--resume"):
                    start_detached(config)  # `rayrollout up` without --resume
                assert engine_gone(namespace)  # and it started nothing
                restart = restart_later(config, errors)
        assert restart is not None
        restart.join(timeout=120)
        assert not errors, errors
        assert service_url(namespace) == url  # the same port: the client found it again
        stats = client.stats()
        ray.get(ray.get_actor(ENGINE_NAME, namespace=namespace).flush.remote())
    finally:
        down(namespace)

    print(f"\nboth killed at {journaled} journaled of {TASKS * N}: {stats.episodes_done} rerun")
    assert Counter(item.trajectory.key for item in items) == expected("b")
    assert [item.cursor for item in items] == list(range(TASKS * N))
    assert KILL_AFTER + UNREAD <= journaled < TASKS * N
    assert stats.episodes_done == TASKS * N - journaled
    before = {item.trajectory.key: item.trajectory for item in items[:journaled]}
    check_the_folder(out, "b", before)
