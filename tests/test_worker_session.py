"""A worker's session with its engine: every episode it holds reports on one stream, at most
one report per interval; rows it writes never travel, rows a caller waits on do; an episode a
killed process already wrote is answered from its part; a closed session's rows reach no part."""

import asyncio
import os
import time

import pyarrow as pa
import pytest

from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Trajectory
from rayrollout.data.tasks import parse_task_row
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.engine.worker_parts import PartsTarget, WorkerParts
from rayrollout.engine.worker_session import WorkerSession


def spec(task_id: str) -> EpisodeSpec:
    return EpisodeSpec(parse_task_row({"task_id": task_id, "prompt": "hi", "environment": "echo"}))


def played(gates: dict[str, asyncio.Event] | None = None):
    """An episode player that ends each episode when its task's gate opens (at once when
    it has none), with an ok row."""

    async def play(episode: EpisodeSpec) -> dict:
        gate = (gates or {}).get(episode.task.task_id)
        if gate is not None:
            await gate.wait()
        return Trajectory(
            task_id=episode.task.task_id,
            sample_index=episode.sample_index,
            group_id=episode.task.task_id,
            environment="echo",
            status="ok",
            reward=1.0,
        ).to_row()

    return play


def parts_in(tmp_path, rows_per_part: int = 100) -> WorkerParts:
    target = PartsTarget(str(tmp_path), "parquet", "run", os.getpid(), rows_per_part, 3600, "n")
    return WorkerParts(target, "w0")


async def test_many_episodes_ending_apart_share_a_few_reports_and_only_waited_rows_travel():
    gates = {f"t{i}": asyncio.Event() for i in range(40)}
    session = WorkerSession(played(gates), parts=None, interval_s=0.2)
    session.take([(i, spec(f"t{i}"), False) for i in range(40)])
    reports, started = [], time.monotonic()

    async def end_apart() -> None:
        for gate in gates.values():  # one episode every 10 ms, over 0.4 s
            gate.set()
            await asyncio.sleep(0.01)

    ending = asyncio.ensure_future(end_apart())
    stream = session.reports()
    while sum(len(r.finished) for r in reports) < 40:
        reports.append(await asyncio.wait_for(anext(stream), 30))
    await ending
    elapsed = time.monotonic() - started
    # 40 episodes in at most one report per 0.2 s (the first at once), not 40 messages.
    assert len(reports) <= 2 + elapsed / 0.2, (len(reports), elapsed)
    assert sorted(seq for r in reports for seq in r.finished) == list(range(40))
    table = pa.concat_tables([r.table() for r in reports])
    returned = [seq for r in reports for seq in r.returned]
    assert table.column("task_id").to_pylist() == [f"t{seq}" for seq in returned]
    tallies = [r.tally.by_env["echo"] for r in reports if r.tally.by_env]
    assert sum(t.episodes for t in tallies) == 40
    assert sum(t.statuses.get("ok", 0) for t in tallies) == 40
    session.close()


class Observed:
    """Stands in for ``EpisodeHistograms``: the task ids of the episodes observed."""

    def __init__(self) -> None:
        self.task_ids: list[str] = []

    def observe(self, row: dict) -> None:
        self.task_ids.append(row["task_id"])


async def test_episodes_the_engine_counted_already_stay_out_of_the_tally_and_histograms():
    """An episode sent again after it finished on a lost session was counted by the engine
    then: played again, it is reported finished but neither tallied nor observed twice."""
    observed = Observed()
    session = WorkerSession(played(), None, interval_s=0.01, histograms=observed)  # type: ignore[arg-type]
    session.take([(1, spec("fresh"), False), (2, spec("again"), False)], counted=[2])
    stream = session.reports()
    finished, tallied = [], 0
    while len(finished) < 2:
        report = await asyncio.wait_for(anext(stream), 30)
        finished += report.finished
        tallied += report.tally.episodes
    assert sorted(finished) == [1, 2] and tallied == 1
    assert observed.task_ids == ["fresh"]
    session.close()


async def test_rows_the_worker_writes_come_back_as_committed_never_as_rows(tmp_path, engine_lock):
    parts = parts_in(tmp_path, rows_per_part=3)
    session = WorkerSession(played(), parts, interval_s=0.01)
    session.take([(7, spec("a"), True), (8, spec("b"), True), (9, spec("c"), False)])
    stream = session.reports()
    finished, committed, returned, written = set(), set(), [], []
    while len(committed) < 2 or len(finished) < 3:
        report = await asyncio.wait_for(anext(stream), 30)
        finished |= set(report.finished)
        returned += report.returned
        committed |= set(report.committed)
        written += report.parts
        if len(finished) == 3 and len(committed) < 2:
            await parts.flush()  # the part is not full: written now
    assert finished == {7, 8, 9} and committed == {7, 8} and returned == [9]
    assert written == [str(tmp_path / "part-run-w0.00000.parquet")]
    assert RunFolder(tmp_path).written_keys() == {("a", 0), ("b", 0)}
    session.close()


async def test_an_episode_a_killed_process_wrote_is_answered_from_its_part(tmp_path, engine_lock):
    killed = WorkerSession(played(), parts_in(tmp_path), interval_s=0.01)
    killed.take([(1, spec("done"), True)])
    stream = killed.reports()
    await asyncio.wait_for(anext(stream), 30)  # finished, in the buffer
    await killed.parts.flush()  # renamed, but the engine never heard of it
    calls: list[str] = []

    async def play(episode: EpisodeSpec) -> dict:
        calls.append(episode.task.task_id)
        return await played()(episode)

    restarted = WorkerSession(play, parts_in(tmp_path), interval_s=0.01)
    restarted.take([(1, spec("done"), True), (2, spec("new"), True)])
    report = await asyncio.wait_for(anext(restarted.reports()), 30)
    assert 1 in report.finished and 1 in report.committed and calls in ([], ["new"])
    assert report.parts == [str(tmp_path / "part-run-w0.00000.parquet")]
    assert report.returned == []
    restarted.close()


async def test_a_closed_sessions_rows_never_reach_a_part_and_its_episodes_stop(
    tmp_path, engine_lock
):
    gates = {"slow": asyncio.Event()}
    parts = parts_in(tmp_path)
    session = WorkerSession(played(gates), parts, interval_s=0.01)
    session.take([(1, spec("fast"), True), (2, spec("slow"), True)])
    stream = session.reports()
    report = await asyncio.wait_for(anext(stream), 30)
    assert report.finished == [1] and report.committed == []
    await asyncio.sleep(0.05)
    session.close()
    await parts.flush()
    assert RunFolder(tmp_path).parts() == [] and session.running == {}
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)
