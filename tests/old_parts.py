"""Output parts as an older rayrollout wrote them, for tests that newer readers still read them
(a plain module, not a conftest: its names import the same whichever conftest loaded last)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rayrollout import trajectory_arrow_schema
from rayrollout.data.schema import Trajectory, Turn


def new_row(*turns: Turn, **fields: Any) -> Trajectory:
    """The row ``write_before_and_after`` writes as it is written now: task and group 'new',
    sample 0 of environment 'e', with ``turns`` and ``fields``."""
    return Trajectory(
        task_id="new", sample_index=0, group_id="new", environment="e", turns=list(turns), **fields
    )


def write_before_and_after(
    folder: Path, row: dict[str, Any], turn_fields: set[str], **old: Any
) -> dict[str, Any]:
    """Two Parquet parts in ``folder``: first ``row`` as written before turns had
    ``turn_fields`` (as task and group 'old', with ``old``'s fields), then ``row`` as written
    now. The old part sorts first, so its schema must not hide the fields in the newer part.
    Returns the old row (as a JSONL part holds it)."""
    old_row = {**row, "task_id": "old", "group_id": "old", **old}
    old_row["turns"] = [{k: v for k, v in t.items() if k not in turn_fields} for t in row["turns"]]
    schema = trajectory_arrow_schema()
    turns = schema.field("turns").type.value_type
    old_turn = pa.struct([f for f in turns if f.name not in turn_fields])
    old_schema = schema.set(schema.get_field_index("turns"), pa.field("turns", pa.list_(old_turn)))
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([old_row], schema=old_schema), folder / "part-a.parquet")
    pq.write_table(pa.Table.from_pylist([row], schema=schema), folder / "part-b.parquet")
    return old_row
