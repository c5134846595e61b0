"""What a worker hands back about its episodes (``WorkerReport``): which finished, with their
sums per environment that the engine's figures and counters read (``tally``); which its own
parts now hold; and the rows of the episodes a caller waits on (``generate``, the service's
stream) as one Arrow table. The rows a worker writes itself never travel.

Rows travel as Arrow, not as Python dicts: the worker builds the table (its CPU is spread
over the pool) and the engine, one process for the whole run, only concatenates tables for
the writer. Profiled at 256 episodes in flight, unpickling nested row dicts and building
tables from them was over a third of the engine's CPU. The table crosses the Ray call as
Arrow IPC stream bytes (about 2 us per row each way), not as a ``pa.Table``: Ray's own
pickling of a table rebuilds it array by array in Python, measured at about 190 us per row
for this nested schema. The engine turns a table back into rows only for chunks a
``generate`` caller waits on.

The rows become one struct array, not a table by columns (``Table.from_pylist``): a batch is
often one or two rows (episodes finish one at a time on a busy policy), and Arrow sets up a
converter per column for each call, about 0.15 ms of the 0.45 a one-row batch cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from rayrollout.data.writer import SCHEMA
from rayrollout.engine.tally import Tally

__all__ = ["ChunkRows", "WorkerReport", "summarize", "warm_arrow"]

_ROW_TYPE = pa.struct(SCHEMA)

_METRIC_FIELDS = (
    "started_at",
    "turns",
    "tool_calls",
    "seconds_model",
    "seconds_tools",
    "seconds_verify",
    "seconds_total",
    "seconds_queued",
    "tokens_in",
    "tokens_out",
)


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """The part of a row that ``Tally.add`` and ``EpisodeHistograms.observe`` read."""
    metrics = row["metrics"]
    summary_metrics = {name: metrics[name] for name in _METRIC_FIELDS}
    summary_metrics["timeline"] = [
        {"kind": e["kind"], "name": e["name"], "seconds": e["seconds"]}
        for e in metrics["timeline"]
        if e["kind"] == "tool"
    ]
    return {
        "environment": row["environment"],
        "status": row["status"],
        "reward": row["reward"],
        "close_error": row["close_error"] is not None,
        "metrics": summary_metrics,
        "turns": [{"seconds": turn["seconds"]} for turn in row["turns"]],
    }


@dataclass
class ChunkRows:
    """Rows as they travel: which episodes (``indices``), their summaries, and the rows
    themselves as Arrow IPC bytes (empty when there are none)."""

    arrow: bytes
    summaries: list[dict[str, Any]]
    indices: list[int]

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], indices: list[int]) -> ChunkRows:
        return cls(_ipc(rows) if rows else b"", [summarize(r) for r in rows], indices)

    def table(self) -> pa.Table:
        return _table(self.arrow)

    def rows(self) -> list[dict[str, Any]]:
        """The full rows again (as Parquet gives them back: ``Trajectory.from_row`` reads them)."""
        return self.table().to_pylist()


@dataclass
class WorkerReport:
    """One message of a worker's report stream (``worker_session``), about the episodes the
    engine numbered: ``finished``, with the ``tally`` of those the engine has not counted
    yet; the rows of ``returned`` (those the worker does not write) as Arrow IPC bytes in
    that order; ``committed``, whose rows the renamed ``parts`` now hold (written in
    ``write_seconds``)."""

    finished: list[int]
    tally: Tally
    returned: list[int]
    arrow: bytes
    committed: list[int]
    parts: list[str]
    write_seconds: float

    @classmethod
    def build(
        cls,
        finished: list[int],
        tally: Tally,
        back: list[tuple[int, dict[str, Any]]],
        committed: list[int],
        parts: list[str],
        seconds: float,
    ) -> WorkerReport:
        rows = [row for _, row in back]
        arrow = _ipc(rows) if rows else b""
        returned = [seq for seq, _ in back]
        return cls(finished, tally, returned, arrow, committed, parts, seconds)

    def table(self) -> pa.Table:
        """The rows of ``returned``, as the engine delivers and writes them."""
        return _table(self.arrow)


def _table(arrow: bytes) -> pa.Table:
    if not arrow:
        return SCHEMA.empty_table()
    return pa.ipc.open_stream(arrow).read_all()


def warm_arrow() -> None:
    """Build one empty table of the row schema: Arrow imports pandas and its compute functions
    at the first table it builds, which a worker pays when it is made, not in its first chunk
    (where it held every episode of the worker for a second)."""
    _ipc([])


def _ipc(rows: list[dict[str, Any]]) -> bytes:
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=_ROW_TYPE))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as stream:
        stream.write_batch(batch)
    return sink.getvalue().to_pybytes()
