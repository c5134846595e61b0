"""A batch's journal in the run's output folder: what lets the service answer a batch again,
with what was already finished, after the engine (or the service itself) was killed.

A batch's rows live in the service's memory until the client acknowledges them, and the
engine writes its rows to parts only every so often: a killed process takes both with it.
So every batch keeps, under ``<output.dir>/_batches/<batch_id>/``:

    batch.json   what a re-submit must match (the request's digest, ``n``, ``write``) and
                 the first sample index of each task: written before any sample runs
    rows.jsonl   every finished row as its stream line, in cursor order, appended (and
                 handed to the OS) before any stream sends it
    acked        the cursor below which the client acknowledged the rows

A re-submit of the batch (same id, same tasks) finds it here when the service that ran it is
gone (``rayrollout up --resume``): the rows come back under the cursors they were streamed
with, and only the samples missing run. Appends reach the OS, not the disk (no fsync):
a killed process loses nothing, a machine that loses power may lose the last rows, which
then run again. A journal is deleted when its batch settles (every row finished and
acknowledged) or is deleted. ``_batches`` starts with an underscore, so readers of the
folder's parts (ours, pyarrow, pandas, Ray Data) skip it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from rayrollout.api.errors import OpenJournalsError

__all__ = [
    "BATCHES_DIR",
    "BatchJournal",
    "JournalState",
    "OpenJournalsError",
    "journal_root",
    "open_journals",
    "refuse_open_journals",
    "unframe",
]

BATCHES_DIR = "_batches"
_META, _ROWS, _ACKED = "batch.json", "rows.jsonl", "acked"


def journal_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / BATCHES_DIR


@dataclass
class JournalState:
    """A journal read back: its ``batch.json``, its rows (stream lines) and the ack."""

    meta: dict[str, Any]
    lines: list[bytes] = field(default_factory=list)
    acked: int = 0

    def keys(self) -> list[tuple[str, int]]:
        """``(task_id, sample_index)`` of each row, in cursor order."""
        keys = []
        for line in self.lines:
            row = orjson.loads(line)["trajectory"]
            keys.append((row["task_id"], row["sample_index"]))
        return keys

    def rows(self) -> list[bytes]:
        """The rows alone, as the engine's JSON: each stream line without its frame."""
        return [unframe(line) for line in self.lines]


class BatchJournal:
    """One batch's journal: made at submit, appended as rows come, removed when settled."""

    def __init__(self, root: Path, batch_id: str) -> None:
        self.path = root / batch_id
        self._rows: IO[bytes] | None = None

    @classmethod
    def create(cls, root: Path, batch_id: str, meta: dict[str, Any]) -> BatchJournal:
        """A new journal (an old one of the same id, which no re-submit matched, replaced)."""
        journal = cls(root, batch_id)
        if journal.path.exists():
            shutil.rmtree(journal.path)
        journal.path.mkdir(parents=True)
        _replace(journal.path / _META, json.dumps(meta).encode())
        return journal

    @classmethod
    def load(cls, root: Path, batch_id: str) -> tuple[BatchJournal, JournalState] | None:
        """The journal of ``batch_id`` and what it holds, or None when there is none.

        A last line cut short (the service killed while appending it) is dropped from the
        file: that row was never streamed, and its sample runs again.
        """
        journal = cls(root, batch_id)
        try:
            meta = json.loads((journal.path / _META).read_bytes())
        except (OSError, ValueError):
            return None
        state = JournalState(meta)
        rows = journal.path / _ROWS
        if rows.exists():
            data = rows.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) != len(data):
                with rows.open("r+b") as handle:
                    handle.truncate(len(whole))
            state.lines = [line + b"\n" for line in whole.split(b"\n")[:-1]]
        try:
            state.acked = min(int((journal.path / _ACKED).read_text()), len(state.lines))
        except (OSError, ValueError):
            state.acked = 0
        return journal, state

    def append(self, lines: list[bytes]) -> None:
        """Rows about to be streamed, after those already journaled."""
        if self._rows is None:
            self._rows = (self.path / _ROWS).open("ab")
        self._rows.write(b"".join(lines))
        self._rows.flush()

    def acknowledge(self, cursor: int) -> None:
        _replace(self.path / _ACKED, str(cursor).encode())

    def close(self) -> None:
        """Stop appending (the service closes); the journal stays for a later service."""
        if self._rows is not None:
            self._rows.close()
            self._rows = None

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


def open_journals(output_dir: str | Path) -> list[dict[str, Any]]:
    """The ``batch.json`` of every journal in the folder (batches not settled)."""
    root = journal_root(output_dir)
    if not root.is_dir():
        return []
    metas = []
    for path in sorted(root.iterdir()):
        try:
            metas.append(json.loads((path / _META).read_bytes()))
        except (OSError, ValueError):
            continue  # a journal cut short before its batch.json: no batch ran from it
    return metas


def refuse_open_journals(output_dir: str | Path, resume: bool) -> None:
    """``up`` over a folder whose batches were left unfinished by a service now gone: with
    ``resume`` a re-submit is answered from them; without, they would be silently replaced.

    Raises:
        OpenJournalsError: journals are there and ``resume`` is not set.
    """
    if resume:
        return
    metas = open_journals(output_dir)
    if not metas:
        return
    names = ", ".join(repr(m.get("batch_id")) for m in metas[:3]) + (
        ", ..." if len(metas) > 3 else ""
    )
    raise OpenJournalsError(
        f"output folder {output_dir} holds {len(metas)} unfinished batch(es) of an earlier "
        f"rollout service ({names}, in {journal_root(output_dir)}); nothing was started. Pass "
        "--resume (resume: true) to answer a trainer re-submitting them with what was "
        f"finished, or delete {journal_root(output_dir)} to start afresh"
    )


def unframe(line: bytes) -> bytes:
    """The row of a stream line ``{"cursor":k,"trajectory":ROW}`` (``batches`` frames it)."""
    start = line.index(b',"trajectory":') + len(b',"trajectory":')
    return line[start : line.rindex(b"}")]


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file renamed)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
