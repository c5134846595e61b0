"""What a worker hands back for a chunk of episodes: which finished, with the few figures per
episode that the engine's counters and metrics read; which its own parts now hold; and the
rows of the episodes a caller waits on (``generate``, the service's stream) as one Arrow
table. The rows a worker writes itself never travel.

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

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from rayrollout.data.writer import SCHEMA

if TYPE_CHECKING:
    from rayrollout.engine.worker_parts import Finished

__all__ = ["ChunkRows", "summarize"]

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
    """The part of a row that ``RunStats.add`` and ``RunMetrics.on_rows`` read."""
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
    """Finished episodes of a chunk: which of the chunk's specs (``indices``, positions in
    the list the worker was sent), their summaries, and the rows of those the worker does
    not write itself, in the same order (Arrow IPC bytes; empty when there are none).
    ``committed`` are the specs whose rows the worker's renamed ``parts`` now hold (written
    in ``write_seconds``)."""

    arrow: bytes
    summaries: list[dict[str, Any]]
    indices: list[int]
    committed: list[int] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)  # the specs of the rows in ``arrow``
    write_seconds: float = 0.0  # the worker's time writing those parts

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], indices: list[int]) -> ChunkRows:
        return cls(_ipc(rows), [summarize(r) for r in rows], indices, returned=indices)

    @classmethod
    def from_finished(cls, batch: Finished, written: Collection[int]) -> ChunkRows:
        """A worker's item: the rows at ``written`` stay out (they go to its parts)."""
        back = [k for k, i in enumerate(batch.indices) if i not in written]
        rows = [batch.rows[k] for k in back]
        return cls(
            _ipc(rows) if rows else b"",
            [summarize(r) for r in batch.rows],
            batch.indices,
            batch.committed,
            batch.parts,
            [batch.indices[k] for k in back],
            batch.seconds,
        )

    def table(self) -> pa.Table:
        if not self.arrow:
            return SCHEMA.empty_table()
        return pa.ipc.open_stream(self.arrow).read_all()

    def rows(self) -> list[dict[str, Any]]:
        """The full rows again (as Parquet gives them back: ``Trajectory.from_row`` reads them)."""
        return self.table().to_pylist()


def _ipc(rows: list[dict[str, Any]]) -> bytes:
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=_ROW_TYPE))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as stream:
        stream.write_batch(batch)
    return sink.getvalue().to_pybytes()
