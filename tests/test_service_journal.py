"""A batch's journal on its own (no Ray): what a service started again reads back, a last
line cut short by a kill, the acknowledged cursor, and `up`'s refusal of a folder holding
unfinished batches without --resume. The journal at work across a real engine restart is
``test_service_restart.py``'s."""

from __future__ import annotations

import json

import pytest

from rayrollout.api.service.journal import (
    BatchJournal,
    OpenJournalsError,
    journal_root,
    open_journals,
    refuse_open_journals,
    unframe,
)
from rayrollout.errors import InputError


def line(cursor: int, task_id: str, sample: int) -> bytes:
    row = json.dumps({"task_id": task_id, "sample_index": sample, "reward": 0.5})
    return b'{"cursor":%d,"trajectory":%s}\n' % (cursor, row.encode())


def test_a_journal_reads_back_its_rows_under_their_cursors_and_the_acknowledged_cursor(tmp_path):
    root = journal_root(tmp_path)
    meta = {"batch_id": "b", "digest": "d", "n": 2, "write": True, "first_index": {"t": 4}}
    journal = BatchJournal.create(root, "b", meta)
    journal.append([line(0, "t", 4), line(1, "t", 5)])
    journal.append([line(2, "u", 0)])
    journal.acknowledge(2)
    journal.close()

    loaded = BatchJournal.load(root, "b")
    assert loaded is not None
    _, state = loaded
    assert state.meta == meta and state.acked == 2
    assert state.keys() == [("t", 4), ("t", 5), ("u", 0)]
    assert [json.loads(row)["sample_index"] for row in state.rows()] == [4, 5, 0]
    assert unframe(line(7, "x", 1)) == line(7, "x", 1)[len(b'{"cursor":7,"trajectory":') : -2]
    assert [m["batch_id"] for m in open_journals(tmp_path)] == ["b"]
    assert BatchJournal.load(root, "never") is None


def test_a_last_line_cut_short_by_a_kill_is_dropped_and_appending_goes_on_after_it(tmp_path):
    root = journal_root(tmp_path)
    BatchJournal.create(root, "b", {"batch_id": "b", "digest": "d"}).append([line(0, "t", 0)])
    with (root / "b" / "rows.jsonl").open("ab") as rows:
        rows.write(line(1, "t", 1)[:20])  # the service killed in the middle of a write
    (root / "b" / "acked").write_text("5")  # past the rows kept: read as what is there

    journal, state = BatchJournal.load(root, "b") or pytest.fail("no journal")
    assert state.keys() == [("t", 0)] and state.acked == 1
    journal.append([line(1, "t", 1)])
    journal.close()
    _, again = BatchJournal.load(root, "b") or pytest.fail("no journal")
    assert again.keys() == [("t", 0), ("t", 1)]


def test_a_removed_journal_is_gone_and_a_new_one_replaces_an_old_one_of_the_same_id(tmp_path):
    root = journal_root(tmp_path)
    old = BatchJournal.create(root, "b", {"batch_id": "b", "digest": "old"})
    old.append([line(0, "t", 0)])
    old.close()
    new = BatchJournal.create(root, "b", {"batch_id": "b", "digest": "new"})
    _, state = BatchJournal.load(root, "b") or pytest.fail("no journal")
    assert state.meta["digest"] == "new" and state.lines == []
    new.remove()
    assert open_journals(tmp_path) == [] and not (root / "b").exists()


def test_up_without_resume_refuses_a_folder_holding_unfinished_batches(tmp_path):
    refuse_open_journals(tmp_path, resume=False)  # no journals: nothing to refuse
    BatchJournal.create(journal_root(tmp_path), "step-3", {"batch_id": "step-3"}).close()
    with pytest.raises(OpenJournalsError, match=r"1 unfinished batch\(es\).*'step-3'.*--resume"):
        refuse_open_journals(tmp_path, resume=False)
    assert issubclass(OpenJournalsError, InputError)
    refuse_open_journals(tmp_path, resume=True)
