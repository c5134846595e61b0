"""Every example dataset in NeMo Gym 0.7.0's wheel, read by rayrollout's task reader.

Each ``resources_servers/*/data/example.jsonl`` must be read whole, or refused whole, each
row with an ``InvalidTaskError`` that names the NeMo Gym feature rayrollout does not run.
Which datasets are refused, and why, is pinned below: a new kind of failure fails the test,
and so does a known refusal in a dataset that used to be read. Read rows are also checked
for the invariant that the rest of rayrollout relies on: ``task.fields`` is the row, every
key verbatim, which is what goes back to the resources server's ``/seed_session``, and it
comes back unchanged from a Parquet output file.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from trajectories import unplayed

from rayrollout.data.responses import seed_body
from rayrollout.data.schema import Trajectory, trajectory_arrow_schema
from rayrollout.data.tasks import UNSUPPORTED, InvalidTaskError, iter_task_rows, parse_task_row

# The features rayrollout refuses, as each refusal names them after "UNSUPPORTED: ".
RUN_TIME_FIRST_OBSERVATION = "a first observation made at run time"
USERSIM = "NeMo UserSim's simulated user"
AUDIO = "audio input"

# Every dataset of 0.7.0 that is refused, and the one reason all its rows are refused for.
REFUSED = {
    # aviary, toolsandbox and terminal_bench_4 are read: their /seed_session answers the
    # first observation (test_nemo_gym_seeded.py).
    # An agent harness writes the prompt from the row's other fields.
    "gdpval": RUN_TIME_FIRST_OBSERVATION,
    "scicode": RUN_TIME_FIRST_OBSERVATION,
    "legal_agent_bench": RUN_TIME_FIRST_OBSERVATION,
    "nemo_user_sim": USERSIM,
    "asr_with_pc": AUDIO,
}
DATASETS = 145


def read_dataset(path: Path) -> tuple[list[tuple[dict[str, Any], Any]], list[InvalidTaskError]]:
    """Every row of one file: ``(row, task)`` pairs read, and the errors of the others."""
    read, refused = [], []
    for line, row, _ in iter_task_rows(path):
        if isinstance(row, InvalidTaskError):
            refused.append(row)
            continue
        try:
            task = parse_task_row(
                row, default_environment="nemo_gym", source=path.parent.parent.name, line=line
            )
        except InvalidTaskError as exc:
            refused.append(exc)
        else:
            read.append((row, task))
    return read, refused


def feature_of(error: InvalidTaskError) -> str | None:
    """The NeMo Gym feature a refusal names, or None when the error names none."""
    prefix = f"{UNSUPPORTED}: "
    if not error.message.startswith(prefix):
        return None
    return error.message[len(prefix) :].split(". ", 1)[0]


def test_every_example_dataset_is_read_or_refused_for_a_named_feature(ng_src, tmp_path):
    files = sorted(ng_src.glob("resources_servers/*/data/example.jsonl"))
    assert len(files) == DATASETS, f"expected 0.7.0's {DATASETS} example datasets"
    outcomes: dict[str, str] = {}
    rows_read = 0
    trajectories = []
    problems = []
    for path in files:
        name = path.parent.parent.name
        read, refused = read_dataset(path)
        assert read or refused, f"{name}: no rows"
        features = {feature_of(error) for error in refused}
        if not refused:
            outcomes[name] = "read"
        elif not read and len(features) == 1 and None not in features:
            outcomes[name] = f"refused: {features.pop()}"
        else:
            problems.append(
                f"{name}: {len(read)} rows read, {len(refused)} refused; first error: {refused[0]}"
            )
            continue
        for row, task in read:
            rows_read += 1
            flat = "resolved_row" not in row and "task_input" not in row
            if flat and task.fields != row:
                problems.append(f"{name}: task.fields is not the row: {sorted(task.fields)}")
            if flat and seed_body(task) != row:
                problems.append(f"{name}: /seed_session would not get the row as it is")
            trajectories.append(unplayed(task))
    counts = collections.Counter(outcomes.values())
    print(f"\nNeMo Gym 0.7.0 example datasets: {len(files)} files, {rows_read} rows read")
    for outcome, count in sorted(counts.items()):
        print(f"  {count:4d} {outcome}")
    for name, outcome in sorted(outcomes.items()):
        if outcome != "read":
            print(f"       {name}: {outcome}")
    assert not problems, "\n".join(problems)
    refused = {name: o.removeprefix("refused: ") for name, o in outcomes.items() if o != "read"}
    assert refused == REFUSED

    # task.fields reaches a Parquet output file and comes back as it went in.
    table = pa.Table.from_pylist(
        [t.to_row() for t in trajectories], schema=trajectory_arrow_schema()
    )
    pq.write_table(table, tmp_path / "trajectories.parquet")
    back = pq.read_table(tmp_path / "trajectories.parquet").to_pylist()
    assert [Trajectory.from_row(row).task_fields for row in back] == [
        t.task_fields for t in trajectories
    ]
