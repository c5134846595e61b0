"""A run's output folder; one job: one owner of what is in it, how it is named and read.

Every part, journal and rejects file of the folder, named and read here alone.

Every reader and writer of the folder goes through ``RunFolder``, so they agree on what a
part is and which rows are there, and no path writes a sample twice. A folder holds
``part-<run>-<n>.parquet`` (or ``.jsonl``) parts, ``part-<run>-<writer>.<n>`` parts each
worker writes itself, ``.tmp`` parts being written (readers skip dot-files), the engine's
``.lock``, the workers' commit fence ``.writers``, ``_rejects.jsonl`` and the service's
``_batches/`` journals. Parquet parts read under the current schema, old column names
under new ones.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from rayrollout.data.errors import PartError, WriterError
from rayrollout.data.folder_lock import LockHolder, acquire
from rayrollout.data.schema import (
    RENAMED_COLUMNS,
    Trajectory,
    renamed_columns,
    trajectory_arrow_schema,
)
from rayrollout.data.task_digests import DigestTable, NextSamples, SampleKeys

__all__ = [
    "FORMATS",
    "LOCK_FILE",
    "WRITERS_FILE",
    "REJECTS_FILE",
    "LockHolder",
    "SCHEMA",
    "PartError",
    "RunFolder",
    "WriterError",
]

FORMATS = ("parquet", "jsonl")
REJECTS_FILE = "_rejects.jsonl"
LOCK_FILE = ".lock"
WRITERS_FILE = ".writers"
SCHEMA = trajectory_arrow_schema()
# What Parquet parts are scanned with: the current schema plus each older column name, typed
# as its new column, so an old part's values are there to read under the new name.
_SCAN_SCHEMA = pa.schema(
    [*SCHEMA, *(pa.field(old, SCHEMA.field(new).type) for old, new in RENAMED_COLUMNS.items())]
)
_BATCH = 256  # rows per Parquet batch handed out as dicts: a few MB with token ids
_KEY_BATCH = 65_536  # two small columns only


def _suffix(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; use one of {', '.join(FORMATS)}")
    return f".{fmt}"


class RunFolder:
    """A run's output folder: its parts, temporary files, lock, rejects and rows.

    Args:
        directory: The folder (need not exist yet: readers then find no parts).
        fmt: The format new parts are written in (``parquet`` or ``jsonl``); unset, it is
            detected from the parts already there (``format``).
    """

    def __init__(self, directory: str | Path, fmt: str | None = None) -> None:
        if fmt is not None:
            _suffix(fmt)  # refuses an unknown format here, not at the first part
        self.path = Path(directory)
        self._format = fmt
        self._lock: IO[str] | None = None
        self.driver_pid: int | None = None
        """The process whose run this writer serves (its driver), noted in the lock file so
        that a second run can tell a live run from a killed one's orphan; None: this one."""
        self._rejected: DigestTable | None = None  # digests of the rejects file's lines

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r}, fmt={self._format!r})"

    # What is in the folder.

    @property
    def format(self) -> str:
        """The format given, else the folder's: that of its newest part (the last run's,
        when a run switched formats), ``parquet`` for a folder without parts."""
        if self._format is not None:
            return self._format
        parts = self.parts()
        if not parts:
            return "parquet"
        newest = max(parts, key=lambda p: (p.stat().st_mtime, p.name))
        return newest.suffix.lstrip(".")

    def parts(self, fmt: str | None = None) -> list[Path]:
        """Whole part files, Parquet first, each format in name order (a run's parts in the
        order written); ``fmt`` keeps one format. Temporary (dot) files are never parts."""
        if not self.path.is_dir():
            return []
        found: list[Path] = []
        for name in FORMATS if fmt is None else (fmt,):
            found += sorted(self.path.glob(f"part-*{_suffix(name)}"))
        return found

    @staticmethod
    def run_of(part: Path) -> str:
        """The run id in a part's name: ``part-<run>-<nnnnn>.<ext>`` or a worker's
        ``part-<run>-<writer>.<nnnnn>.<ext>`` -> ``<run>``."""
        return part.stem.removeprefix("part-").rsplit("-", 1)[0]

    def writer_parts(self, run_id: str, writer: str) -> list[Path]:
        """The whole parts one writer (a worker) of run ``run_id`` wrote, in any format."""
        if not self.path.is_dir():
            return []
        prefix = f"part-{run_id}-{writer}."
        return sorted(p for p in self.parts() if p.name.startswith(prefix))

    def parts_of_other_runs(self, run_id: str | None) -> list[Path]:
        """Whole parts that the run ``run_id`` did not write (all of them for None)."""
        return [p for p in self.parts() if run_id is None or self.run_of(p) != run_id]

    def remove(self, parts: Iterable[Path], rejects: bool = False) -> None:
        """Delete ``parts`` (``--overwrite``), and the rejects file if ``rejects``; only the
        lock holder's run may call this."""
        for part in parts:
            part.unlink(missing_ok=True)
        if rejects:
            self.rejects_path.unlink(missing_ok=True)
            self._rejected = None

    @property
    def rejects_path(self) -> Path:
        """Where ``--skip-invalid`` writes the task rows it left out."""
        return self.path / REJECTS_FILE

    def add_reject(self, record: dict[str, Any]) -> None:
        """Append one rejected task row's record (reason and raw line) to the rejects file,
        once: a ``--resume`` reads the same tasks file and meets the same bad rows again.
        The lines written are remembered by digest, so a million bad rows cost 12 bytes
        each, not their text."""
        line = json.dumps(record, ensure_ascii=False)
        if self._rejected is None:
            self._rejected = DigestTable()
            try:
                with self.rejects_path.open(encoding="utf-8") as file:
                    self._rejected.load(known.rstrip("\n").encode() for known in file)
            except FileNotFoundError:
                pass
        if line.encode() in self._rejected:
            return
        self.create()
        with self.rejects_path.open("a", encoding="utf-8") as file:
            file.write(line + "\n")
        self._rejected.setdefault(line.encode())

    # Writing.

    def create(self) -> None:
        """Make the folder (and its parents) if missing."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriterError(f"cannot create output folder {self.path}: {exc}") from exc

    def part_path(
        self, run_id: str, number: int, fmt: str | None = None, writer: str | None = None
    ) -> Path:
        """The name of a run's ``number``-th part (of ``writer``'s parts, for a worker that
        writes its own): runs and writers never overwrite each other's parts."""
        stem = f"{run_id}-{number:05d}" if writer is None else f"{run_id}-{writer}.{number:05d}"
        return self.path / f"part-{stem}{_suffix(fmt or self.format)}"

    def write_part(
        self,
        run_id: str,
        number: int,
        write: Callable[[Path], None],
        fmt: str | None = None,
        writer: str | None = None,
    ) -> Path:
        """Write a part whole or not at all: ``write`` fills a hidden temporary file, which is
        then renamed into place (atomic on one file system); returns the part's path."""
        final = self.part_path(run_id, number, fmt, writer)
        temporary = final.with_name(f".{final.name}.tmp")
        try:
            write(temporary)
            os.replace(temporary, final)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise WriterError(f"cannot write {final}: {exc}") from exc
        return final

    def remove_temporaries(self, run_id: str | None = None, writer: str | None = None) -> None:
        """Delete half-written parts (of one run, or of any: a killed run's, at start; of one
        writer of a run: a restarted worker's own).

        They were never renamed, so never read; only the lock holder, or a writer for its
        own, may call this."""
        pattern = (
            f".part-{run_id or '*'}-*.tmp" if writer is None else f".part-{run_id}-{writer}.*.tmp"
        )
        for stale in self.path.glob(pattern):
            stale.unlink(missing_ok=True)

    @contextmanager
    def fenced(self, holder_pid: int) -> Iterator[None]:
        """Hold the workers' commit fence while writing a part for the engine ``holder_pid``.

        A worker writes its parts only while the engine that sent it the episodes holds the
        folder's lock: a worker left running by a killed engine (or driver) finds the lock
        free or held by another process and refuses (``WriterError``), so it never adds a
        row behind a resumed run's back. The fence (``.writers``, shared by writers, taken
        whole by ``take_lock``) closes the gap between the check and the rename: a new
        engine waits for every write that passed the check before it reads the folder.
        """
        self.create()
        with (self.path / WRITERS_FILE).open("a+") as fence:
            fcntl.flock(fence, fcntl.LOCK_SH)
            try:
                holder = self._lock_holder_pid()
                if holder != holder_pid:
                    raise WriterError(
                        f"the engine (pid {holder_pid}) no longer holds {self.path / LOCK_FILE} "
                        f"({'it is free' if holder is None else f'pid {holder} holds it'}): "
                        "its rows are not written; run again with --resume"
                    )
                yield
            finally:
                fcntl.flock(fence, fcntl.LOCK_UN)

    def _lock_holder_pid(self) -> int | None:
        """The pid noted in the lock file while some process holds the lock; None if free."""
        try:
            probe = (self.path / LOCK_FILE).open("r")
        except FileNotFoundError:
            return None
        with probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: by whom, the note says
                holder = LockHolder.read(self.path / LOCK_FILE)
                return holder.pid if holder is not None else -1
            fcntl.flock(probe, fcntl.LOCK_UN)
            return None

    def _wait_for_writers(self, timeout_s: float) -> None:
        """Wait until no worker is inside ``fenced`` (a write that passed its check while an
        earlier engine held the lock may still be renaming its part)."""
        with (self.path / WRITERS_FILE).open("a+") as fence:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fence, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise WriterError(
                            f"a worker of an earlier run is still writing to {self.path} after "
                            f"{timeout_s:g} s ({self.path / WRITERS_FILE}); stop it, or use "
                            "another --out"
                        ) from None
                    time.sleep(0.05)
                    continue
                fcntl.flock(fence, fcntl.LOCK_UN)
                return

    def take_lock(self, timeout_s: float = 60.0, unknown_wait_s: float = 10.0) -> None:
        """Become the folder's one writer, or refuse at once while another live run writes.

        A second live run is refused at once, naming the holder; a killed run's orphaned
        writer (its driver gone) is waited for up to ``timeout_s``, a holder that cannot be
        told (another host) ``unknown_wait_s`` (see ``folder_lock.acquire``). The OS drops
        the lock when the holding process dies, so a SIGKILLed run never leaves it locked.
        """
        if self._lock is not None:
            return
        self.create()
        lock, holder = acquire(self.path / LOCK_FILE, self.driver_pid, timeout_s, unknown_wait_s)
        if lock is None:
            raise WriterError(
                f"another run is still writing to {self.path} "
                f"({holder.describe() if holder else 'a writer'} holds "
                f"{self.path / LOCK_FILE}); wait for it to end or stop it, or use another --out"
            )
        self._lock = lock
        try:
            self._wait_for_writers(timeout_s)
        except WriterError:
            self.release_lock()
            raise

    def release_lock(self) -> None:
        """Let another run write the folder (closing the file drops the flock)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    @property
    def locked(self) -> bool:
        """Whether this object holds the folder's lock."""
        return self._lock is not None

    # Reading.

    def rows(
        self,
        columns: Iterable[str] | None = None,
        *,
        exclude: Iterable[str] = (),
        parts: Iterable[Path] | None = None,
        task_id: str | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(where, row)`` for every row of every part, part by part, batch by batch.

        ``where`` names the row for error messages (``part-x.jsonl line 3``). Rows are as
        ``Trajectory.from_row`` reads them. ``columns`` limits what is read (else all),
        ``exclude`` drops columns (the bulky ``turns``), ``parts`` reads only those files
        (default: all of the folder's), ``task_id`` keeps one task's rows (Parquet skips row
        groups by their statistics). Raises ``PartError`` naming a malformed line or file.
        """
        wanted = set(columns) if columns is not None else None
        dropped = set(exclude)

        def keep(name: str) -> bool:
            return (wanted is None or name in wanted) and name not in dropped

        for path in self.parts() if parts is None else parts:
            path = Path(path)
            if path.suffix == ".parquet":
                names = [name for name in SCHEMA.names if keep(name)]
                for index, row in enumerate(_parquet_rows(path, names, task_id)):
                    yield f"{path.name} row {index}", row
            else:
                for where, row in _jsonl_rows(path, task_id):
                    yield where, {k: v for k, v in renamed_columns(row).items() if keep(k)}

    def trajectories(
        self, parts: Iterable[Path] | None = None, task_id: str | None = None
    ) -> Iterator[Trajectory]:
        """Every trajectory of the folder (or of ``parts``, or of one task), streamed."""
        for _, row in self.rows(parts=parts, task_id=task_id):
            yield Trajectory.from_row(row)

    def table(self, columns: list[str], parts: Iterable[Path] | None = None) -> pa.Table:
        """``columns`` of every row as one Arrow table of the current schema, both formats.

        For analyses over whole columns (``rayrollout report``); JSONL rows go through the
        model, so their timestamps and defaults match the Parquet rows'.
        """
        paths = [Path(p) for p in (self.parts() if parts is None else parts)]
        schema = pa.schema([SCHEMA.field(name) for name in columns])
        tables = []
        parquet = [p for p in paths if p.suffix == ".parquet"]
        if parquet:
            import pyarrow.dataset as ds  # here: it imports pandas (0.3 s) at a worker's start

            try:
                scan = ds.dataset([str(p) for p in parquet], format="parquet", schema=_SCAN_SCHEMA)
                tables.append(scan.to_table(columns=_projection(columns)))
            except (pa.ArrowException, OSError) as exc:
                raise PartError(f"{self.path}: cannot read its Parquet parts: {exc}") from None
        jsonl = [p for p in paths if p.suffix != ".parquet"]
        if jsonl:
            rows = [Trajectory.from_row(row).to_row() for _, row in self.rows(parts=jsonl)]
            tables.append(pa.Table.from_pylist(rows, schema=SCHEMA).select(columns))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def written_pairs(self) -> Iterator[tuple[str, int]]:
        """Every ``(task_id, sample_index)`` in the folder, part by part, from parts of every
        format, so a run resumed with another ``--format`` still skips what is done."""
        for path in self.parts():
            if path.suffix == ".parquet":
                columns = ["task_id", "sample_index"]
                for batch in _parquet_batches(path, columns, None, _KEY_BATCH):
                    task_ids, indices = batch.column(0).to_pylist(), batch.column(1).to_pylist()
                    yield from zip(task_ids, indices, strict=True)
            else:
                for where, row in _jsonl_rows(path):
                    if row.get("task_id") is None or row.get("sample_index") is None:
                        raise PartError(f"{where}: a row needs 'task_id' and 'sample_index'")
                    yield row["task_id"], row["sample_index"]

    def written_keys(self) -> set[tuple[str, int]]:
        """Every ``(task_id, sample_index)`` in the folder, as a set of tuples (about 150
        bytes a key: for tests and small folders; a resumed run reads ``written_digests``)."""
        return set(self.written_pairs())

    def written_digests(self) -> SampleKeys:
        """Every ``(task_id, sample_index)`` in the folder as 12-byte digests: what
        ``--resume`` skips, in memory flat however many rows the folder holds."""
        return SampleKeys(self.written_pairs())

    def next_sample_indices(self) -> dict[str, int]:
        """The first sample index not yet written, per task id in the folder: where
        ``generate(write=True)`` continues, so ``(task_id, sample_index)`` stays unique."""
        following: dict[str, int] = {}
        for task_id, index in self.written_pairs():
            following[task_id] = max(following.get(task_id, 0), index + 1)
        return following

    def next_samples(self) -> NextSamples:
        """``next_sample_indices`` as digests (16 bytes a task), for an engine that keeps
        it for the whole of a training run."""
        return NextSamples((task_id, index + 1) for task_id, index in self.written_pairs())


def _parquet_rows(path: Path, columns: list[str], task_id: str | None) -> Iterator[dict[str, Any]]:
    """A Parquet part's rows under the current schema, as the model reads them.

    A part written before a field existed scans with nulls in its place; those keys are
    dropped from the row, so the model fills its default (a null would fail an ``int``).
    """
    own = _part_schema(path)
    current, old = pa.struct(list(SCHEMA)), pa.struct(list(_current_names(own)))
    upgrade = _lacks_fields(current, old)
    for batch in _parquet_batches(path, columns, task_id, _BATCH):
        for row in batch.to_pylist():
            if upgrade:
                _drop_absent(row, current, old)
            yield row


def _current_names(schema: pa.Schema) -> pa.Schema:
    """A part's schema with each column of an older name under its new one."""
    names = [RENAMED_COLUMNS.get(n, n) if n not in SCHEMA.names else n for n in schema.names]
    return pa.schema([field.with_name(name) for field, name in zip(schema, names, strict=True)])


def _projection(columns: list[str]) -> list[str] | dict[str, Any]:
    """What to read of a scan under ``_SCAN_SCHEMA``: ``columns``, a renamed one taken from
    its older column in parts that lack it."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    older = {new: old for old, new in RENAMED_COLUMNS.items()}
    if not older.keys() & set(columns):
        return columns
    return {
        name: pc.coalesce(ds.field(name), ds.field(older[name]))
        if name in older
        else ds.field(name)
        for name in columns
    }


def _part_schema(path: Path) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise PartError(f"{path.name}: cannot read it as Parquet: {exc}") from None


def _lacks_fields(current: pa.DataType, old: pa.DataType) -> bool:
    """Whether ``old`` lacks a (nested) field of ``current``."""
    if pa.types.is_struct(current) and pa.types.is_struct(old):
        for field in current:
            index = old.get_field_index(field.name)
            if index < 0 or _lacks_fields(field.type, old.field(index).type):
                return True
    elif _is_list(current) and _is_list(old):
        return _lacks_fields(current.value_type, old.value_type)
    return False


def _drop_absent(value: Any, current: pa.DataType, old: pa.DataType) -> None:
    """Remove from ``value`` (a row, in place) the keys ``old`` did not have."""
    if value is None:
        return
    if pa.types.is_struct(current) and pa.types.is_struct(old):
        for field in current:
            index = old.get_field_index(field.name)
            if index < 0:
                value.pop(field.name, None)
            else:
                _drop_absent(value.get(field.name), field.type, old.field(index).type)
    elif _is_list(current) and _is_list(old):
        for item in value:
            _drop_absent(item, current.value_type, old.value_type)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _parquet_batches(
    path: Path, columns: list[str], task_id: str | None, batch_size: int
) -> Iterator[pa.RecordBatch]:
    """A Parquet part's batches under the current schema (see the module's docstring)."""
    import pyarrow.dataset as ds

    try:
        scan = ds.dataset(str(path), format="parquet", schema=_SCAN_SCHEMA)
        where = ds.field("task_id") == task_id if task_id is not None else None
        projection = _projection(columns)
        yield from scan.to_batches(columns=projection, filter=where, batch_size=batch_size)
    except (pa.ArrowException, OSError) as exc:
        raise PartError(f"{path.name}: cannot read it as Parquet: {exc}") from None


def _jsonl_rows(path: Path, task_id: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """A JSONL part's rows, named by line; ``task_id`` skips lines without it unparsed."""
    needle = json.dumps(task_id, ensure_ascii=False) if task_id is not None else None
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip() or (needle is not None and needle not in line):
                continue
            where = f"{path.name} line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PartError(f"{where}: malformed JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise PartError(f"{where}: a row must be a JSON object")
            if task_id is None or row.get("task_id") == task_id:
                yield where, row
