"""The run folder: one owner of part names, format, lock, rejects, resume keys and old parts."""

import json
import os
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trajectories import write_through

from rayrollout.cli.report import load_run
from rayrollout.cli.show import find_trajectories
from rayrollout.data.config import RunConfig
from rayrollout.data.export import export_run
from rayrollout.data.run_folder import (
    LOCK_FILE,
    REJECTS_FILE,
    SCHEMA,
    LockHolder,
    RunFolder,
    WriterError,
)
from rayrollout.data.schema import EpisodeMetrics, Trajectory, Turn
from rayrollout.data.writer import make_sink


def trajectory(task_id, sample_index, **fields):
    return Trajectory(
        task_id=task_id, sample_index=sample_index, group_id=task_id, environment="echo", **fields
    )


def write(directory, fmt, run_id, trajectories):
    """Parts as the engine writes them: through a sink that holds the folder's lock."""
    return write_through(make_sink(directory, fmt, run_id), trajectories, 2)


def test_format_is_the_given_one_else_the_newest_parts_else_parquet(tmp_path):
    folder = RunFolder(tmp_path / "run")
    assert folder.format == "parquet"  # no parts yet: the config's default
    [jsonl] = write(folder.path, "jsonl", "a", [trajectory("t", 0)])
    assert folder.format == "jsonl"
    [parquet] = write(folder.path, "parquet", "b", [trajectory("t", 1)])
    os.utime(jsonl, (1, 1))  # the JSONL part is the older one: the last run wrote Parquet
    assert folder.format == "parquet"
    os.utime(parquet, (0, 0))
    assert folder.format == "jsonl"
    assert RunFolder(folder.path, "parquet").format == "parquet"
    with pytest.raises(ValueError, match="unknown output format 'csv'; use one of parquet"):
        RunFolder(folder.path, "csv")


def test_parts_of_both_formats_are_listed_and_dot_files_never(tmp_path):
    write(tmp_path, "parquet", "a", [trajectory(f"p{i}", 0) for i in range(3)])
    write(tmp_path, "jsonl", "b", [trajectory("j", 0)])
    (tmp_path / ".part-c-00000.parquet.tmp").write_bytes(b"half a part")
    (tmp_path / REJECTS_FILE).write_text("{}\n")
    names = [p.name for p in RunFolder(tmp_path).parts()]
    assert names == ["part-a-00000.parquet", "part-a-00001.parquet", "part-b-00000.jsonl"]
    assert [p.name for p in RunFolder(tmp_path).parts("jsonl")] == ["part-b-00000.jsonl"]
    assert RunFolder(tmp_path / "missing").parts() == []


def test_resume_keys_come_from_parts_of_every_format(tmp_path):
    # A run written as Parquet, resumed with --format jsonl: the Parquet rows still count.
    write(tmp_path, "parquet", "first", [trajectory("a", 0), trajectory("a", 1)])
    write(tmp_path, "jsonl", "second", [trajectory("a", 2), trajectory("b", 0)])
    expected = {("a", 0), ("a", 1), ("a", 2), ("b", 0)}
    assert RunFolder(tmp_path).written_keys() == expected
    # The folder's format picks what is written next, never which parts count as done.
    assert RunFolder(tmp_path, "jsonl").written_keys() == expected
    assert RunFolder(tmp_path, "parquet").written_keys() == expected


def test_generate_continues_each_tasks_sample_indices_after_both_formats(tmp_path):
    write(tmp_path, "parquet", "first", [trajectory("a", 0), trajectory("a", 4)])
    write(tmp_path, "jsonl", "second", [trajectory("a", 5), trajectory("b", 0)])
    assert RunFolder(tmp_path).next_sample_indices() == {"a": 6, "b": 1}
    assert RunFolder(tmp_path / "empty").next_sample_indices() == {}


def test_one_writer_at_a_time_and_the_lock_is_free_after_release(tmp_path):
    first, second = RunFolder(tmp_path), RunFolder(tmp_path)
    first.take_lock()
    assert first.locked
    with pytest.raises(WriterError, match="another run is still writing to .*stop it, or use"):
        second.take_lock(timeout_s=0.3)
    assert not second.locked
    first.release_lock()
    second.take_lock(timeout_s=0.3)
    assert second.locked
    second.release_lock()


def test_a_sink_waits_for_the_folder_another_run_holds(tmp_path):
    holder = RunFolder(tmp_path)
    holder.take_lock()
    sink = make_sink(tmp_path, "jsonl", "r")
    sink.lock_timeout_s = 0.3
    with pytest.raises(WriterError, match="another run is still writing"):
        sink.start()
    holder.release_lock()
    sink.start()
    sink.complete()


def test_a_part_that_fails_to_write_leaves_neither_part_nor_temporary(tmp_path):
    folder = RunFolder(tmp_path, "parquet")

    def broken(path):
        path.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(WriterError, match=r"cannot write .*part-r-00000.parquet: disk full"):
        folder.write_part("r", 0, broken)
    assert list(tmp_path.iterdir()) == []


def test_rejects_go_to_the_one_file_the_config_names(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.add_reject({"line": 2, "field": "prompt"})
    folder.add_reject({"line": 3, "field": None})
    lines = (tmp_path / "run" / "_rejects.jsonl").read_text().splitlines()
    assert [json.loads(line)["line"] for line in lines] == [2, 3]
    assert folder.rejects_path.name == REJECTS_FILE == "_rejects.jsonl"
    assert REJECTS_FILE in RunConfig.model_fields["skip_invalid"].description
    assert folder.parts() == []  # rejects are no part


def old_part(path):
    """A part from before three fields existed: ``close_error``, ``metrics.seconds_queued``
    and a turn's ``policy_version``."""
    row = trajectory(
        "old",
        0,
        reward=1.0,
        turns=[Turn(completion_token_ids=[1])],
        metrics=EpisodeMetrics(turns=1, seconds_total=2.0),
    ).to_row()
    del row["close_error"], row["metrics"]["seconds_queued"]
    del row["turns"][0]["policy_version"]

    def without(kind, name):
        return pa.struct([f for f in kind if f.name != name])

    turn = without(SCHEMA.field("turns").type.value_type, "policy_version")
    fields = []
    for field in SCHEMA:
        if field.name == "close_error":
            continue
        if field.name == "metrics":
            field = field.with_type(without(field.type, "seconds_queued"))
        if field.name == "turns":
            field = field.with_type(pa.list_(turn))
        fields.append(field)
    pq.write_table(pa.Table.from_pylist([row], schema=pa.schema(fields)), path)


def test_an_old_part_reads_under_the_current_schema_for_every_reader(tmp_path):
    old_part(tmp_path / "part-a-00000.parquet")  # sorts first: must not hide newer fields
    new = trajectory("new", 0, close_error="gone", turns=[Turn(policy_version=3)])
    write(tmp_path, "parquet", "b", [new])
    by_id = {t.task_id: t for t in RunFolder(tmp_path).trajectories()}
    old = by_id["old"]
    assert old.close_error is None and old.metrics.seconds_queued == 0.0
    assert old.turns[0].policy_version == 0 and old.metrics.seconds_total == 2.0
    assert by_id["new"] == new
    # show, report and export read it through the same folder.
    assert [t.task_id for t in find_trajectories(tmp_path, "old")] == ["old"]
    frame = load_run(tmp_path)
    assert sorted(frame["task_id"]) == ["new", "old"]
    assert frame.set_index("task_id")["m_seconds_total"]["old"] == 2.0
    summary = export_run("sft", tmp_path, tmp_path.parent / "sft.jsonl", min_reward=1.0)
    assert summary.rows_read == 2 and summary.rows_written == 1


def test_an_older_rows_agent_column_reads_as_its_worker_for_every_reader(tmp_path):
    """Rows written when the worker actor's name was the ``agent`` column: Parquet and JSONL
    parts read with it as ``worker`` (resume, show, report, export read the same folder)."""
    rows = {}
    for task_id in ("pq", "js"):
        row = trajectory(task_id, 0, worker=f"{task_id}-worker", played_by="tool_loop").to_row()
        row["agent"] = row.pop("worker")
        rows[task_id] = row
    fields = [f.with_name("agent") if f.name == "worker" else f for f in SCHEMA]
    table = pa.Table.from_pylist([rows["pq"]], schema=pa.schema(fields))
    pq.write_table(table, tmp_path / "part-a-00000.parquet")
    line = json.dumps({**rows["js"], "created_at": str(rows["js"]["created_at"])})
    (tmp_path / "part-b-00000.jsonl").write_text(line + "\n")
    write(tmp_path, "parquet", "c", [trajectory("new", 0, worker="worker:1")])

    folder = RunFolder(tmp_path)
    workers = {t.task_id: (t.worker, t.played_by) for t in folder.trajectories()}
    assert workers == {
        "pq": ("pq-worker", "tool_loop"),
        "js": ("js-worker", "tool_loop"),
        "new": ("worker:1", ""),
    }
    assert {row["task_id"]: row["worker"] for _, row in folder.rows(["task_id", "worker"])} == {
        "pq": "pq-worker",
        "js": "js-worker",
        "new": "worker:1",
    }
    assert folder.table(["task_id", "worker"]).to_pydict()["worker"] == [
        "pq-worker",
        "worker:1",
        "js-worker",
    ]
    assert folder.written_keys() == {("pq", 0), ("js", 0), ("new", 0)}
    assert [t.worker for t in find_trajectories(tmp_path, "pq")] == ["pq-worker"]
    assert sorted(load_run(tmp_path)["task_id"]) == ["js", "new", "pq"]
    summary = export_run("sft", tmp_path, tmp_path.parent / "sft.jsonl", min_reward=0.0)
    assert summary.rows_read == 3


def test_one_tasks_rows_are_found_in_both_formats(tmp_path):
    write(tmp_path, "parquet", "a", [trajectory("x", 0), trajectory("y", 0)])
    write(tmp_path, "jsonl", "b", [trajectory("x", 1), trajectory("x y", 0)])
    found = RunFolder(tmp_path).trajectories(task_id="x")
    assert sorted((t.task_id, t.sample_index) for t in found) == [("x", 0), ("x", 1)]
    frame = load_run(tmp_path)
    assert sorted(frame["task_id"]) == ["x", "x", "x y", "y"]


def test_a_second_live_run_is_refused_at_once_naming_the_holder(tmp_path):
    holder = RunFolder(tmp_path)
    holder.take_lock()  # this process is the holder and its run's (live) driver
    started = time.monotonic()
    with pytest.raises(WriterError) as refused:
        RunFolder(tmp_path).take_lock(timeout_s=30)
    assert time.monotonic() - started < 2  # not the 30 s a killed run's orphan gets
    print(f"\nCONCURRENT {refused.value}")
    assert f"the writer pid {os.getpid()} on {socket.gethostname()} holds" in str(refused.value)
    assert "wait for it to end or stop it, or use another --out" in str(refused.value)
    holder.release_lock()


def test_a_killed_runs_orphaned_writer_is_waited_for_then_the_lock_is_taken(tmp_path):
    # The holder serves a driver that is gone (SIGKILLed): it is an orphan Ray is about to
    # end, so a resumed run waits for it rather than refusing.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from rayrollout.data.run_folder import RunFolder; "
            f"f = RunFolder(sys.argv[1]); f.driver_pid = {dead.pid}; f.take_lock(); "
            "print('locked', flush=True); time.sleep(1.5)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert orphan.stdout is not None and orphan.stdout.readline().strip() == "locked"
    holder = LockHolder.read(tmp_path / LOCK_FILE)
    assert holder is not None and (holder.pid, holder.driver_pid) == (orphan.pid, dead.pid)
    assert holder.driver_alive() is False
    resumed = RunFolder(tmp_path)
    resumed.take_lock(timeout_s=30, unknown_wait_s=0.1)  # waits past unknown_wait_s
    assert resumed.locked and orphan.wait(timeout=5) == 0
    resumed.release_lock()


def test_parts_of_other_runs_are_told_by_the_run_id_in_their_names(tmp_path):
    write(tmp_path, "parquet", "20250101-000000-abc123", [trajectory("a", 0)])
    write(tmp_path, "jsonl", "mine", [trajectory("b", 0)])
    folder = RunFolder(tmp_path)
    assert [RunFolder.run_of(p) for p in folder.parts()] == ["20250101-000000-abc123", "mine"]
    assert [p.suffix for p in folder.parts_of_other_runs("mine")] == [".parquet"]
    assert len(folder.parts_of_other_runs(None)) == 2
