"""A worker's own parts: written whole under the folder's commit fence, each chunk call told
which of its episodes a part holds, a restarted worker answering from its killed process's
parts, and a worker of a dead engine refused."""

import asyncio
import os
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayrollout.data.run_folder import SCHEMA, RunFolder, WriterError
from rayrollout.data.schema import Trajectory
from rayrollout.data.writer import make_sink
from rayrollout.engine.worker_parts import CONVERT_ROWS, ChunkCommits, PartsTarget, WorkerParts


def row(task_id: str, sample_index: int = 0) -> dict:
    return Trajectory(
        task_id=task_id, sample_index=sample_index, group_id=task_id, environment="echo"
    ).to_row()


def target(tmp_path, holder_pid: int, rows_per_part: int = 2, flush_s: float = 3600) -> PartsTarget:
    return PartsTarget(str(tmp_path), "parquet", "run", holder_pid, rows_per_part, flush_s, "n")


async def test_rows_go_to_whole_parts_by_size_and_age_and_each_call_hears_of_its_own(
    tmp_path, engine_lock
):
    parts = WorkerParts(target(tmp_path, os.getpid(), rows_per_part=2, flush_s=0.2), "w0")
    first, second = ChunkCommits(), ChunkCommits()
    parts.add(first, [0], [row("a")])
    parts.add(second, [0], [row("b")])  # two rows: a part is due
    parts.add(second, [1], [row("c")])  # waits for the age limit
    await asyncio.wait_for(first.changed.wait(), 5)
    assert first.take()[:2] == ([0], [str(tmp_path / "part-run-w0.00000.parquet")])
    committed, written, seconds = [], [], 0.0
    while len(committed) < 2:  # the second part comes when its row is 0.2 s old
        await asyncio.wait_for(second.changed.wait(), 30)
        more = second.take()
        committed, written, seconds = committed + more[0], written + more[1], seconds + more[2]
    assert committed == [0, 1] and seconds > 0
    assert written == [str(tmp_path / f"part-run-w0.0000{i}.parquet") for i in (0, 1)]
    assert (first.waiting, second.waiting) == (0, 0)
    folder = RunFolder(tmp_path)
    assert sorted(folder.written_keys()) == [("a", 0), ("b", 0), ("c", 0)]
    assert {RunFolder.run_of(p) for p in folder.parts()} == {"run"}
    assert list(tmp_path.glob(".part-*.tmp")) == []


async def test_an_abandoned_calls_rows_never_reach_a_part(tmp_path, engine_lock):
    parts = WorkerParts(target(tmp_path, os.getpid(), rows_per_part=10), "w0")
    gone, kept = ChunkCommits(), ChunkCommits()
    parts.add(gone, [0], [row("gone")])
    parts.add(kept, [0], [row("kept")])
    parts.abandon(gone)
    await parts.flush()
    assert RunFolder(tmp_path).written_keys() == {("kept", 0)}
    assert kept.take()[0] == [0] and gone.take()[0] == []


async def test_a_restarted_worker_numbers_on_and_answers_from_its_killed_process_parts(
    tmp_path, engine_lock
):
    killed = WorkerParts(target(tmp_path, os.getpid()), "w1")
    killed.add(ChunkCommits(), [0], [row("done", 3)])
    await killed.flush()
    (tmp_path / ".part-run-w1.00001.parquet.tmp").write_bytes(b"half a part")
    other = tmp_path / ".part-run-w0.00000.parquet.tmp"  # another worker's, being written
    other.write_bytes(b"half")
    restarted = WorkerParts(target(tmp_path, os.getpid()), "w1")
    assert not (tmp_path / ".part-run-w1.00001.parquet.tmp").exists() and other.exists()
    found = restarted.written_before(("done", 3))
    assert found is not None and (found[0]["task_id"], found[0]["sample_index"]) == ("done", 3)
    assert found[1].endswith("part-run-w1.00000.parquet")
    assert restarted.written_before(("done", 4)) is None
    restarted.add(ChunkCommits(), [0], [row("next")])
    await restarted.flush()
    assert (tmp_path / "part-run-w1.00001.parquet").exists()


def test_a_worker_writes_only_while_its_engine_holds_the_folder(tmp_path):
    sink = make_sink(tmp_path, "parquet", "run", writer="w0", holder_pid=os.getpid())
    sink.start()
    table = pa.Table.from_pylist([row("x")], schema=SCHEMA)
    with pytest.raises(WriterError, match=r"no longer holds .*it is free.*--resume"):
        sink.write(table)  # no engine holds the lock: a killed engine's worker
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from rayrollout.data.run_folder import RunFolder; "
            "f = RunFolder(sys.argv[1]); f.take_lock(); print('locked', flush=True); "
            "time.sleep(30)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "locked"
        with pytest.raises(WriterError, match=rf"pid {other.pid} holds it"):
            sink.write(table)  # a resumed run's engine holds it now
    finally:
        other.kill()
        other.wait()
    assert RunFolder(tmp_path).parts() == [] and list(tmp_path.glob(".part-*")) == []
    folder = RunFolder(tmp_path)
    folder.take_lock()
    try:
        assert sink.write(table).name == "part-run-w0.00000.parquet"
    finally:
        folder.release_lock()


def test_a_new_engine_waits_for_a_write_that_passed_the_fence(tmp_path):
    folder = RunFolder(tmp_path)
    folder.take_lock()
    inside, leave = threading.Event(), threading.Event()

    def writing() -> None:
        with RunFolder(tmp_path).fenced(os.getpid()):
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=writing)
    thread.start()
    assert inside.wait(5)
    folder.release_lock()
    threading.Timer(0.5, leave.set).start()
    started = time.monotonic()
    resumed = RunFolder(tmp_path)
    resumed.take_lock()  # waits until the write in the fence is done
    assert time.monotonic() - started >= 0.4
    resumed.release_lock()
    thread.join()


async def test_a_part_that_cannot_be_written_ends_its_calls_and_keeps_none_of_their_rows(
    tmp_path,
):
    parts = WorkerParts(target(tmp_path, os.getpid(), rows_per_part=10), "w0")  # no lock held
    owner = ChunkCommits()
    parts.add(owner, [0, 1], [row("a"), row("b")])
    await parts.flush()
    assert isinstance(owner.error, WriterError) and "no longer holds" in str(owner.error)
    assert owner.take()[0] == [] and owner.waiting == 0
    parts.add(owner, [2], [row("c")])  # finished after the failure: the engine answers it
    folder = RunFolder(tmp_path)
    folder.take_lock()
    try:
        assert await parts.flush() == 0 and folder.parts() == []
    finally:
        folder.release_lock()


async def test_rows_added_one_at_a_time_reach_their_part_whole_and_in_order(tmp_path, engine_lock):
    """Rows wait as dicts and go to Arrow in batches (``CONVERT_ROWS``); an abandoned call's
    rows leave both the converted batches and the rows still waiting."""
    count = CONVERT_ROWS + 10  # one batch converted, ten rows still waiting
    parts = WorkerParts(target(tmp_path, os.getpid(), rows_per_part=10 * count), "w0")
    gone, kept = ChunkCommits(), ChunkCommits()
    for i in range(count):
        owner = gone if i % 3 == 0 else kept
        parts.add(owner, [i], [row(f"t{i}")])
    assert len(parts.buffer) == 1 and len(parts.pending) == count - CONVERT_ROWS
    parts.abandon(gone)
    assert parts.buffered == len(parts.owners) == sum(1 for i in range(count) if i % 3)
    await parts.flush()
    [part] = RunFolder(tmp_path).parts()
    written = pq.read_table(part).to_pylist()
    assert [r["task_id"] for r in written] == [f"t{i}" for i in range(count) if i % 3]
    assert written[0] == {**row("t1"), "created_at": written[0]["created_at"]}
    assert kept.take()[0] == [i for i in range(count) if i % 3] and gone.take()[0] == []


async def test_a_row_the_schema_refuses_ends_its_own_call_and_the_others_are_written(
    tmp_path, engine_lock
):
    """Rows converted together: one the schema refuses fails its call alone."""
    parts = WorkerParts(target(tmp_path, os.getpid(), rows_per_part=10), "w0")
    good, bad = ChunkCommits(), ChunkCommits()
    parts.add(good, [0], [row("fine")])
    parts.add(bad, [0, 1], [row("ok but its call fails"), {**row("odd"), "reward": "high"}])
    parts.add(good, [1], [row("fine too")])
    await parts.flush()
    assert isinstance(bad.error, pa.ArrowException) and bad.waiting == 0
    assert bad.take()[0] == []
    assert good.error is None and good.take()[0] == [0, 1]
    assert sorted(RunFolder(tmp_path).written_keys()) == [("fine", 0), ("fine too", 0)]


async def test_a_refused_row_in_a_batch_converted_as_it_arrives_ends_its_own_call_only(
    tmp_path, engine_lock
):
    """The row that fills a batch (``CONVERT_ROWS``) is converted with it at once, in
    ``add``: refused there, it ends its call and the batch's other rows are written."""
    parts = WorkerParts(target(tmp_path, os.getpid(), rows_per_part=10 * CONVERT_ROWS), "w0")
    good, bad = ChunkCommits(), ChunkCommits()
    for i in range(CONVERT_ROWS - 1):
        parts.add(good, [i], [row(f"g{i}")])
    parts.add(bad, [0], [{**row("odd"), "reward": "high"}])
    assert isinstance(bad.error, pa.ArrowException) and bad.waiting == 0
    assert parts.pending == [] and parts.buffered == len(parts.owners) == CONVERT_ROWS - 1
    await parts.flush()
    assert good.error is None and good.take()[0] == list(range(CONVERT_ROWS - 1))
    assert len(RunFolder(tmp_path).written_keys()) == CONVERT_ROWS - 1
