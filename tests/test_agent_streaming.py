"""A worker hands finished episodes back while the rest of their chunk still runs."""

from __future__ import annotations

import time

import pytest
from flaky_policy import FlakyPolicy

from rayrollout import RunConfig
from rayrollout.data.schema import Trajectory
from rayrollout.data.tasks import parse_task_row
from rayrollout.engine.chunks import ChunkRows
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.engine.feeding import (
    Refill,
    most_within,
    reserve,
    send_limits,
    worker_limits,
    worker_share,
    worker_with_room,
)
from rayrollout.engine.worker import WorkerRunner, WorkerSpec


async def test_a_slow_episode_does_not_hold_back_the_rest_of_its_chunk(tmp_path):
    sleeps = [0.0, 1.5, 0.0, 0.0]
    specs = [
        EpisodeSpec(
            parse_task_row(
                {"task_id": f"s{i}", "prompt": f"say {i}", "environment": "sleepy", "sleep_s": s}
            )
        )
        for i, s in enumerate(sleeps)
    ]
    with FlakyPolicy(fault_rate=0.0) as flaky:
        config = RunConfig.model_validate(
            {
                "environments": {"sleepy": {"path": "fixture_envs:SleepyEnv"}},
                "policy": {"kind": "openai", "base_url": flaky.base_url},
                "output": {"dir": str(tmp_path)},
            }
        )
        runner = WorkerRunner(WorkerSpec("worker:test", config, flaky.base_url))
        started = time.monotonic()
        batches = []
        try:
            async for indices, rows in runner.stream(specs):
                batches.append((time.monotonic() - started, indices, rows))
        finally:
            await runner.policy.close()
    # The fast episodes stream back (in one batch or several, as the flush timer falls) before
    # the slow one ends; no bound on when, so a loaded machine cannot fail it.
    *early, (last_at, last, last_rows) = batches
    assert sorted(i for _, indices, _ in early for i in indices) == [0, 2, 3], batches
    assert last == [1] and last_at >= 1.5
    assert all(at < last_at for at, _, _ in early)
    assert [row["task_id"] for row in last_rows] == ["s1"]
    # What travels back to the engine reads back as the same trajectories.
    chunk = ChunkRows.from_rows(last_rows, last)
    [trajectory] = [Trajectory.from_row(row) for row in chunk.rows()]
    assert trajectory.task_id == "s1" and trajectory.status == "ok" and trajectory.reward == 1.0
    assert chunk.summaries[0]["status"] == "ok" and chunk.indices == [1]


async def test_the_next_episode_plays_while_the_last_one_is_scored(tmp_path):
    """A worker with one running slot gives it to its next episode once the agent's loop is
    over: the second episode's model call starts while the first one's verifier (1 s) still
    runs, and still only one model call is ever in flight."""
    specs = [
        EpisodeSpec(
            parse_task_row(
                {"task_id": f"v{i}", "prompt": f"say {i}", "environment": "sleepy", "sleep_s": 1.0}
            )
        )
        for i in range(2)
    ]
    with FlakyPolicy(fault_rate=0.0) as flaky:
        config = RunConfig.model_validate(
            {
                "environments": {"sleepy": {"path": "fixture_envs:SleepyEnv"}},
                "policy": {"kind": "openai", "base_url": flaky.base_url},
                "output": {"dir": str(tmp_path)},
            }
        )
        runner = WorkerRunner(WorkerSpec("worker:test", config, flaky.base_url, max_running=1))
        rows = []
        try:
            async for _, batch in runner.stream(specs):
                rows.extend(batch)
        finally:
            await runner.policy.close()
    first, second = sorted(
        (Trajectory.from_row(row) for row in rows), key=lambda t: t.metrics.started_at
    )
    assert first.status == second.status == "ok"
    scored_until = first.metrics.started_at + first.metrics.seconds_total
    assert second.turns[0].started_at < scored_until - 0.5, (first.metrics, second.turns[0])
    assert flaky.most_in_flight == 1


def test_workers_run_at_most_concurrency_episodes_though_more_wait_in_them(tmp_path, serve_session):
    """The engine sends a chunk per worker beyond ``concurrency`` (so no slot idles while rows
    make their round trip), but the workers' shares add up to ``concurrency``: a policy that
    thinks 0.2 s per call sees exactly that many calls at once, never more."""
    from rayrollout import RolloutEngine

    with FlakyPolicy(fault_rate=0.0, think_s=0.2) as flaky:
        config = RunConfig.model_validate(
            {
                "namespace": "admission-test",
                "environments": {"echo": {"path": "fixture_envs:EchoEnv", "hosting": "inline"}},
                "policy": {"kind": "openai", "base_url": flaky.base_url},
                "workers": {"num_workers": 2, "num_cpus": 0.1},
                "concurrency": 7,
                "output": {"dir": str(tmp_path / "out")},
                "ray": {"serve_port": serve_session},
            }
        )
        tasks = [
            {"task_id": f"say-{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(60)
        ]
        with RolloutEngine(config) as engine:
            result = engine.collect(tasks)
    assert result.summary["total"]["statuses"] == {"ok": 60}
    assert flaky.most_in_flight == 7


def test_the_reserve_shrinks_as_episodes_get_longer():
    """A chunk per worker before the first rows and for short episodes; for minute-long ones
    about one episode, so a round's tail does not wait behind a busy worker's reserve."""
    assert reserve(256, 2, None) == 128 == reserve(256, 2, 0.07)  # 2 chunks of 64
    assert reserve(256, 2, 0.28) == 92  # 256 x 0.1 s / 0.28 s, rounded up
    assert reserve(256, 2, 60.0) == 1
    assert reserve(7, 2, None) == 2  # chunks of one when concurrency is small


def test_the_reserve_covers_the_refill_it_measured():
    """A slow refill (a loaded machine, a slow verifier) grows the reserve to cover it both
    ways; a quick one keeps the 0.1 s floor; a chunk per worker stays the most."""
    assert reserve(32, 2, 1.6, refill_s=0.01) == 2 == reserve(32, 2, 1.6)  # 32 x 0.1 / 1.6
    assert reserve(32, 2, 1.6, refill_s=0.25) == 10  # 32 x 0.5 s / 1.6 s
    assert reserve(32, 2, 1.6, refill_s=5.0) == 16  # two chunks of 8


def test_the_refill_is_measured_from_the_rows():
    """The reserve follows the episode time and refill lag the rows report: quick episodes
    whose rows come back within 0.11 s of their loop's end keep a reserve by rate."""
    refill = Refill(32, 2)
    assert refill.reserve() == 16  # before the first rows: a chunk per worker
    metrics = {"seconds_total": 1.6, "seconds_verify": 0.01}
    for i in range(8):
        refill.observe([{"metrics": {**metrics, "started_at": 200.0 + i}}], now=201.7 + i)
    assert refill.reserve() == 5  # 32 x 0.22 s (a 0.11 s refill, both ways) / 1.6 s


def test_the_reserve_covers_a_wave_of_episodes_that_end_together():
    """Samples cut at the same length end in the same step of the policy's batch: the
    reserve covers as many as were seen ending within one refill (up to a chunk per
    worker), where the rate alone gave two; episodes that end apart keep the rate's."""
    metrics = {"seconds_total": 1.6, "seconds_verify": 0.01}
    wave = Refill(32, 2)
    for i in range(12):  # twelve loops ending within 5 ms, rows back 0.02 s later
        end = 100.0 + 0.0004 * i
        wave.observe([{"metrics": {**metrics, "started_at": end - 1.59}}], now=end + 0.02)
    assert wave.burst == 12 and wave.reserve() == 12
    apart = Refill(32, 2)
    for i in range(12):  # the same episodes ending 0.15 s apart
        end = 100.0 + 0.15 * i
        apart.observe([{"metrics": {**metrics, "started_at": end - 1.59}}], now=end + 0.02)
    assert apart.burst == 1 and apart.reserve() == 2  # 32 x 0.1 s / 1.6 s
    assert reserve(32, 2, 1.6, burst=40) == 16  # still at most a chunk per worker
    assert most_within([0.0, 0.01, 0.02, 1.0, 1.05], 0.1) == 3
    assert most_within([], 0.1) == 0


@pytest.mark.parametrize(("chunk", "waiting"), [(8, 2), (8, 16), (64, 1), (1, 5)])
def test_a_batch_is_sent_while_the_workers_still_hold_their_reserve(chunk, waiting):
    """The feeder sends once a whole batch has room: at that moment every slot may be busy,
    and the episodes already out beyond ``concurrency`` must still be the whole reserve."""
    most, batch = send_limits(32, chunk, waiting)
    assert 1 <= batch <= min(chunk, waiting)
    assert most - batch == 32 + waiting


@pytest.mark.parametrize(
    ("concurrency", "workers", "chunk", "waiting"),
    [(32, 2, 8, 16), (32, 2, 8, 3), (33, 4, 4, 7), (256, 8, 16, 128)],
)
def test_the_feeder_fills_every_worker_alike(concurrency, workers, chunk, waiting):
    """Batches go to the worker with the most room until none has room: each then holds its
    share of ``concurrency`` and the same part of the reserve (less than a batch apart), so no
    worker's slots wait for a refill while another holds episodes they could have run."""
    limits = [worker_limits(concurrency, workers, i, chunk, waiting) for i in range(workers)]
    batch = limits[0][1]
    loads = [0] * workers
    while (index := worker_with_room([most for most, _ in limits], loads, batch)) is not None:
        loads[index] += batch
    shares = [worker_share(concurrency, workers, i) for i in range(workers)]
    waiting_each = [load - share for load, share in zip(loads, shares, strict=True)]
    assert min(waiting_each) >= 1  # every worker has a next episode ready
    # Counted over all workers, the first fill left one worker a whole batch ahead.
    assert max(waiting_each) - min(waiting_each) < batch
