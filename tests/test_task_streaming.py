"""Task sets of any size in flat memory: ids and resume keys as digests, rows checked as they
stream past the head, ``--limit`` that stops the reading, identical NeMo Gym lines as separate
tasks, shard sets through Ray Data, and a resumed streamed run that writes only what is
missing. Each test prints the message a user sees (``pytest -s``)."""

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trajectories import write_through

from rayrollout.api import collect as collect_module
from rayrollout.api.collect import InvalidTasksError, plan_collect
from rayrollout.data import task_digests
from rayrollout.data.config import RunConfig
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.task_digests import DigestTable, NextSamples, SampleKeys
from rayrollout.data.tasks import (
    InvalidTaskError,
    UniqueTaskIds,
    iter_task_rows,
    parse_task_row,
    read_tasks,
)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def nemo_gym_row(text="Deal me in.", **extra):
    params = {"input": [{"role": "user", "content": text}], "tools": [WEATHER_TOOL]}
    return {"responses_create_params": params, **extra}


def own_row(i, **extra):
    return {"task_id": f"t{i}", "prompt": f"say {i}", "environment": "echo", **extra}


def write_rows(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def echo_config(**data):
    return RunConfig.model_validate(
        {"environments": {"echo": {"path": "fixture_envs:EchoEnv"}}, **data}
    )


def task(task_id, prompt="p"):
    return parse_task_row({"task_id": task_id, "prompt": prompt, "environment": "echo"})


@pytest.fixture
def small_buffer(monkeypatch):
    """Digest buffers of 64 keys: a few thousand keys make many sorted runs, and merges."""
    monkeypatch.setattr(task_digests, "BUFFER", 64)


@pytest.fixture
def small_head(monkeypatch):
    """A head of 10 rows: the rows after it stream, as a large file's do."""
    monkeypatch.setattr(collect_module, "HEAD_ROWS", 10)


# Digests.


def test_a_digest_table_answers_as_a_dict_across_spills_and_merges(small_buffer):
    table, expected = DigestTable(np.dtype("<u8")), {}
    for i in range(5_000):
        key = f"task-{i % 3_000}".encode()
        if i % 3 == 0:
            table.set_max(key, i)
            expected[key] = max(expected.get(key, 0), i)
        elif key not in expected:
            assert table.setdefault(key, i) == i
            expected[key] = i
        else:
            assert table.setdefault(key, -1 % 2**64) == expected[key]
    assert len(table) == len(expected) == 3_000
    assert all(table.get(key) == value for key, value in expected.items())
    assert table.get(b"never") is None and b"never" not in table
    assert len(table._runs) > 1 and table.nbytes <= 20 * len(table)  # 12-byte key, 8-byte value


def test_resume_keys_and_next_samples_are_digests_of_what_the_folder_holds(tmp_path):
    from rayrollout.data.schema import Trajectory
    from rayrollout.data.writer import make_sink

    rows = [
        Trajectory(task_id=f"t{i % 5}", sample_index=i // 5, group_id="g", environment="echo")
        for i in range(12)
    ]
    write_through(make_sink(tmp_path, "parquet", "r1"), rows, 4)
    folder = RunFolder(tmp_path)
    keys = folder.written_digests()
    assert isinstance(keys, SampleKeys) and len(keys) == 12
    assert all(pair in keys for pair in folder.written_keys())
    assert ("t0", 2) in keys and ("t0", 3) not in keys and ("t9", 0) not in keys
    following = folder.next_samples()
    assert isinstance(following, NextSamples)
    assert {f"t{i}": following.get(f"t{i}") for i in range(6)} == folder.next_sample_indices() | {
        "t5": 0
    }


def test_bounded_memory_id_checks_name_both_lines_of_a_repeat(small_buffer):
    unique = UniqueTaskIds()
    for line in range(1, 5_001):
        unique.check(task(f"id-{line}"), "a.jsonl", line)
    assert unique.nbytes <= 24 * len(unique)  # 12-byte id, 8 bytes of place, 4 of content
    clash = task("id-10", "another prompt")
    with pytest.raises(InvalidTaskError) as caught:
        unique.check(clash, "a.jsonl", 4_010)
    print(f"\nREPEAT {caught.value}")
    assert str(caught.value) == (
        "a.jsonl line 4010, field 'task_id': task_id 'id-10' is also on line 10, with "
        "different content; task ids must be unique: give one of the two rows another task_id"
    )
    copy = task("id-20")
    with pytest.raises(InvalidTaskError, match="repeats line 20 of a.jsonl exactly"):
        unique.check(copy, "b.jsonl", 3)  # another shard of the set: named with its shard


# NeMo Gym's numbering of rows.


def test_identical_nemo_gym_lines_are_separate_tasks_numbered_by_line(tmp_path):
    path = write_rows(tmp_path / "blackjack.jsonl", [nemo_gym_row()] * 5)
    tasks = list(read_tasks(path, default_environment="gym"))
    assert len(tasks) == 5 and len({t.task_id for t in tasks}) == 5
    stems = {t.task_id.rsplit("-", 1)[0] for t in tasks}
    assert len(stems) == 1  # one content, numbered by line
    assert [t.task_id.rsplit("-", 1)[1] for t in tasks] == ["1", "2", "3", "4", "5"]
    again = list(read_tasks(path, default_environment="gym"))
    assert [t.task_id for t in again] == [t.task_id for t in tasks]  # what --resume finds
    plan = plan_collect([nemo_gym_row()] * 3, echo_config(environment="echo"))
    assert len({t.task_id for t in plan.tasks}) == 3  # rows in memory: numbered by position


def test_identical_nemo_gym_lines_with_their_own_id_are_separate_tasks_numbered_by_copy(
    tmp_path,
):
    # NeMo Gym plays every line it reads (multichallenge repeats one byte for byte): the
    # first keeps its id, the k-th copy is "<id>#k", each time the file is read.
    hand = nemo_gym_row(task_id="hand-1")
    rows = [hand, nemo_gym_row("Hit me."), hand, nemo_gym_row(task_id="hand-2"), hand]
    path = write_rows(tmp_path / "blackjack.jsonl", rows)
    tasks = list(read_tasks(path, default_environment="gym"))
    ids = [t.task_id for t in tasks]
    assert ids[0] == "hand-1" and ids[2:] == ["hand-1#1", "hand-2", "hand-1#2"]
    assert [t.task_id for t in read_tasks(path, default_environment="gym")] == ids
    assert tasks[2].fields == tasks[0].fields == hand  # the row goes back whole, unrenamed


def test_a_repeated_id_with_other_content_or_in_our_own_format_is_refused(tmp_path):
    rows = [nemo_gym_row(task_id="hand-1"), nemo_gym_row("Hit me.", task_id="hand-1")]
    with pytest.raises(InvalidTaskError) as caught:
        list(read_tasks(write_rows(tmp_path / "clash.jsonl", rows), default_environment="gym"))
    print(f"\nCLASH {caught.value}")
    assert "task_id 'hand-1' is also on line 1, with different content" in str(caught.value)
    path = write_rows(tmp_path / "own.jsonl", [own_row(1), own_row(1)])
    with pytest.raises(InvalidTaskError) as caught:
        list(read_tasks(path))
    assert str(caught.value) == (
        "own.jsonl line 2, field 'task_id': task_id 't1' repeats line 1 exactly; "
        "remove the copy (more samples of one task: --num-repeats)"
    )
    # A copy whose numbered id another row holds: both rows named.
    rows = [
        nemo_gym_row(task_id="h"),
        nemo_gym_row("Hit me.", task_id="h#1"),
        nemo_gym_row(task_id="h"),
    ]
    with pytest.raises(InvalidTaskError) as caught:
        list(read_tasks(write_rows(tmp_path / "taken.jsonl", rows), default_environment="gym"))
    print(f"TAKEN {caught.value}")
    assert str(caught.value) == (
        "taken.jsonl line 3, field 'task_id': task_id 'h' repeats line 1 exactly, and 'h#1', "
        "the id of copy 1, is taken by line 2: give one of these rows another task_id"
    )


# Checks that need no rows come first.


def test_a_dead_policy_or_environment_url_is_refused_before_a_row_is_checked(tmp_path, monkeypatch):
    from rayrollout.api.preflight import EnvironmentUrlError, PolicyCheckError

    read = counted_reads(monkeypatch)
    path = write_rows(tmp_path / "tasks.jsonl", ['{"broken', *[own_row(i) for i in range(50)]])
    out = {"output": {"dir": str(tmp_path / "out")}}
    dead_policy = echo_config(
        policy={"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"}, **out
    )
    with pytest.raises(PolicyCheckError, match="does not answer") as caught:
        plan_collect(path, dead_policy, before_start=True)
    print(f"\nDEAD POLICY {caught.value}")
    assert read == [1]  # one row read (a file without rows would probe nothing), none checked
    read.clear()
    dead_env = RunConfig.model_validate(
        {"environments": {"gym": {"url": "http://127.0.0.1:1"}}, "environment": "gym", **out}
    )
    with pytest.raises(EnvironmentUrlError) as caught:
        plan_collect(path, dead_env, before_start=True)
    print(f"DEAD ENV {caught.value}")
    assert str(caught.value).startswith("environment 'gym' at http://127.0.0.1:1 does not answer")
    assert "--env-url" in str(caught.value) and read == [1]


# Streaming past the head.


def counted_reads(monkeypatch):
    """Every line the plan reads from a tasks file, recorded as it is read."""
    lines: list[int] = []

    def counted(path):
        for line, row, raw in iter_task_rows(path):
            lines.append(line)
            yield line, row, raw

    monkeypatch.setattr(collect_module, "iter_task_rows", counted)
    return lines


def test_limit_stops_the_reading_past_the_head(tmp_path, monkeypatch, small_head):
    read = counted_reads(monkeypatch)
    path = write_rows(tmp_path / "tasks.jsonl", [own_row(i) for i in range(5_000)])
    plan = plan_collect(path, echo_config(limit=25))
    assert read == list(range(1, 11))  # the head only, before anything starts
    assert not plan.complete
    assert [t.task_id for t in plan.tasks] == [f"t{i}" for i in range(25)]
    assert read == list(range(1, 26))  # and then to the limit, not a row more


def test_a_bad_row_past_the_head_stops_the_stream_naming_its_line(tmp_path, small_head):
    rows = [own_row(i) for i in range(60)]
    rows[39] = '{"prompt": "broken'
    path = write_rows(tmp_path / "tasks.jsonl", rows)
    plan = plan_collect(path, echo_config())
    taken = []
    with pytest.raises(InvalidTasksError) as caught:
        for task in plan.tasks:
            taken.append(task.task_id)
    print(f"\nSTOPPED {caught.value}")
    assert caught.value.stopped and len(taken) == 39
    assert "invalid row in" in str(caught.value) and "--resume to finish the run" in str(
        caught.value
    )
    assert "tasks.jsonl line 40: malformed JSON" in str(caught.value)
    skipping = plan_collect(path, echo_config(skip_invalid=True))
    assert len(list(skipping.tasks)) == 59
    assert [(exc.line, raw) for exc, raw in skipping.rejects] == [(40, rows[39])]


def test_an_environment_this_machine_cannot_run_met_past_the_head_is_a_bad_row(
    tmp_path, small_head
):
    """In the head it is the run's error and nothing starts (tests/test_preflight.py); past
    it the run has started, so it is a bad row like any other: named by its line, the
    rows before it kept, and with --skip-invalid a reject."""
    rows = [own_row(i) for i in range(60)]
    rows[39] = rows[45] = own_row(39, environment="needy")
    rows[45]["task_id"] = "t45"
    path = write_rows(tmp_path / "tasks.jsonl", rows)
    environments = {
        "echo": {"path": "fixture_envs:EchoEnv"},
        "needy": {"path": "test_preflight:NeedsFrobnicator"},
    }
    plan = plan_collect(path, RunConfig.model_validate({"environments": environments}))
    taken = []
    with pytest.raises(InvalidTasksError) as caught:
        for task in plan.tasks:
            taken.append(task.task_id)
    print(f"\nUNAVAILABLE {caught.value}")
    assert caught.value.stopped and len(taken) == 39
    assert (
        "tasks.jsonl line 40, field 'environment': environment 'needy' cannot run on this "
        "machine: it needs the frobnicator: apt-get install frobnicator; fix it, then run "
        "again with --resume"
    ) in str(caught.value)
    assert "Nothing was started" not in str(caught.value)
    config = RunConfig.model_validate({"environments": environments, "skip_invalid": True})
    skipping = plan_collect(path, config)
    assert len(list(skipping.tasks)) == 58
    assert [exc.line for exc, _ in skipping.rejects] == [40, 46]


def test_the_progress_total_comes_from_a_count_of_the_rows(tmp_path, small_head):
    path = write_rows(tmp_path / "tasks.jsonl", [own_row(i) for i in range(500)])
    plan = plan_collect(path, echo_config(num_repeats=2, limit=300))
    for _ in range(200):  # the count runs in a thread beside the start
        if plan.rows is not None:
            break
        time.sleep(0.05)
    assert plan.rows == 500 and plan.episodes == 600
    plan.written = {("t0", 0), ("t0", 1)}
    assert plan.episodes == 598


# Shard sets through Ray Data.


def test_a_shard_directory_reads_through_ray_data_naming_a_bad_row_by_shard(
    tmp_path, monkeypatch, small_head, ray_session
):
    from rayrollout.data.task_shards import ShardSet

    shards = tmp_path / "set"
    (shards / "sub").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([own_row(i) for i in range(20)]), shards / "a.parquet")
    b_rows = [own_row(i) for i in range(20, 40)]
    b_rows[6] = "{not json"
    b_rows[7] = ""  # a blank line keeps its number
    write_rows(shards / "sub" / "b.jsonl", b_rows + [nemo_gym_row(environment="echo")] * 2)
    write_rows(shards / "c.jsonl", [nemo_gym_row(environment="echo")] * 2)
    write_rows(shards / "_notes.jsonl", ["not a shard"])
    streamed = []
    real_stream = ShardSet.stream
    monkeypatch.setattr(ShardSet, "stream", lambda self: streamed.append(1) or real_stream(self))
    plan = plan_collect(shards, echo_config(skip_invalid=True))
    ids = [t.task_id for t in plan.tasks]
    assert streamed == [1]  # past the head of 10 rows, through Ray Data
    # In shard order: a.parquet, c.jsonl, sub/b.jsonl (its line 7 bad, line 8 blank).
    assert ids[:20] == [f"t{i}" for i in range(20)]
    assert ids[22:40] == [f"t{i}" for i in range(20, 40) if i not in (26, 27)]
    nemo = ids[20:22] + ids[40:]
    assert len(nemo) == 4 and len(set(nemo)) == 4  # identical lines, shards apart: 4 tasks
    assert [i.rsplit("-", 1)[1] for i in nemo] == ["1", "2", "21", "22"]
    [(exc, raw)] = plan.rejects
    print(f"\nSHARD {exc}")
    assert (exc.source, exc.line, raw) == ("sub/b.jsonl", 7, "{not json")
    assert str(exc).startswith("sub/b.jsonl line 7: malformed JSON")


def test_a_parquet_shard_sets_head_and_count_are_read_by_a_child_not_the_driver(
    tmp_path, monkeypatch
):
    from rayrollout.data.task_shards import ShardReadError, ShardSet

    shards = tmp_path / "set"
    shards.mkdir()
    write_rows(shards / "a.jsonl", [own_row(i) for i in range(3)])
    pq.write_table(pa.Table.from_pylist([own_row(i) for i in range(3, 23)]), shards / "b.parquet")
    pq.write_table(pa.Table.from_pylist([own_row(i) for i in range(23, 43)]), shards / "c.parquet")

    def no_parquet_here(*args, **kwargs):
        raise AssertionError("the driver decoded Parquet")

    monkeypatch.setattr(pq, "ParquetFile", no_parquet_here)
    monkeypatch.setattr(pq, "read_metadata", no_parquet_here)
    head = ShardSet(shards)
    rows = list(head.local_rows(25))
    named = [(source, line) for source, line, _, _ in rows]
    assert named == [("a.jsonl", i) for i in (1, 2, 3)] + [
        ("b.parquet", i) for i in range(1, 21)
    ] + [
        ("c.parquet", 1),
        ("c.parquet", 2),
    ]
    assert [row["task_id"] for _, _, row, _ in rows] == [f"t{i}" for i in range(25)]
    assert head._taken == (2, 2)  # the stream goes on at c.parquet's line 3
    assert head.count_rows() is None  # a JSONL shard: its lines are not counted
    (shards / "a.jsonl").unlink()
    assert ShardSet(shards).count_rows() == 40  # the footers, read by the child
    whole = ShardSet(shards)
    assert len(list(whole.local_rows(1000))) == 40 and whole._taken == (2, 0)

    (shards / "b.parquet").write_text("not Parquet")
    assert ShardSet(shards).count_rows() is None
    with pytest.raises(ShardReadError) as caught:
        list(ShardSet(shards).local_rows(1000))
    print(f"\nSHARD HEAD {caught.value}")
    assert str(caught.value).startswith(f"cannot read the shard set {shards}: b.parquet: ")


# A streamed run, stopped and resumed.


def streamed_run_config(namespace: str, out: Path, serve_port: int) -> dict:
    """A small run of the echo environment: two samples a row, four episodes at a time."""
    return {
        "namespace": namespace,
        "ray": {"serve_port": serve_port},
        "environments": {"echo": {"path": "fixture_envs:EchoEnv"}},
        "output": {"dir": str(out)},
        "num_repeats": 2,
        "concurrency": 4,
    }


def test_a_streamed_run_stops_at_a_bad_row_and_resume_writes_only_what_is_missing(
    tmp_path, small_head, serve_session
):
    from rayrollout import RolloutEngine, read_trajectories

    rows = [own_row(i) for i in range(30)]
    rows[21] = '{"prompt": "broken'
    path = write_rows(tmp_path / "tasks.jsonl", rows)
    config = streamed_run_config(f"stream-{tmp_path.name}", tmp_path / "out", serve_session)
    with RolloutEngine(config) as engine, pytest.raises(InvalidTasksError) as caught:
        engine.collect(path)
    assert caught.value.stopped
    first = sorted((t.task_id, t.sample_index) for t in read_trajectories(tmp_path / "out"))
    assert first == sorted((f"t{i}", s) for i in range(21) for s in range(2))  # to the bad row
    rows[21] = own_row(21)  # fixed
    write_rows(path, rows)
    with RolloutEngine({**config, "resume": True}) as engine:
        result = engine.collect(path)
    assert result.summary.total.episodes == 18  # 9 rows x 2, nothing again
    keys = [(t.task_id, t.sample_index) for t in read_trajectories(tmp_path / "out")]
    assert len(keys) == len(set(keys)) == 60  # 0 duplicated, 0 lost
    assert set(keys) == {(f"t{i}", s) for i in range(30) for s in range(2)}


def test_identical_nemo_gym_lines_play_as_separate_tasks_and_resume_writes_only_what_is_missing(
    tmp_path, small_head, serve_session
):
    from rayrollout import RolloutEngine, read_trajectories

    copy = nemo_gym_row(task_id="q-3", environment="echo")
    rows = [own_row(i) for i in range(12)]
    rows[2:2] = [copy, copy, copy]  # lines 3-5: one line, three times, as multichallenge has
    rows.append(copy)  # and once more past the head
    rows[13] = '{"prompt": "broken'
    path = write_rows(tmp_path / "tasks.jsonl", rows)
    config = streamed_run_config(f"stream-copies-{tmp_path.name}", tmp_path / "out", serve_session)
    with RolloutEngine(config) as engine, pytest.raises(InvalidTasksError):
        engine.collect(path)
    first = {(t.task_id, t.sample_index) for t in read_trajectories(tmp_path / "out")}
    assert {i for i, _ in first} >= {"q-3", "q-3#1", "q-3#2"}  # stopped at line 14
    rows[13] = own_row(99)  # fixed
    write_rows(path, rows)
    with RolloutEngine({**config, "resume": True}) as engine:
        result = engine.collect(path)
    keys = [(t.task_id, t.sample_index) for t in read_trajectories(tmp_path / "out")]
    ids = {"q-3", "q-3#1", "q-3#2", "q-3#3", *(f"t{i}" for i in [*range(12), 99] if i != 10)}
    assert len(keys) == len(set(keys)) == 2 * len(ids)  # 0 duplicated, 0 lost
    assert set(keys) == {(i, s) for i in ids for s in range(2)}
    assert result.summary.total.episodes == 2 * len(ids) - len(first)  # nothing again
