"""Every example dataset in NeMo Gym 0.7.0's wheel, read by ``collect``'s reading path.

Each ``resources_servers/*/data/example.jsonl`` goes through ``plan_collect`` (the command
line's path: the rows checked, ids claimed unique, ``skip_invalid`` keeping what is refused)
and must be read whole, or refused whole, each row with an ``InvalidTaskError`` that names
the NeMo Gym feature rayrollout does not run. Which datasets are refused, and why, is pinned
below: a new kind of failure fails the test, and so does a known refusal in a dataset that
used to be read. Read rows are also checked for what the rest of rayrollout relies on:
``task.fields`` is the row, every key verbatim, which is what goes back to the resources
server's ``/seed_session``, and it comes back unchanged from a Parquet output file; rows
whose opening NeMo Gym's agent writes are the ``nemo_gym`` agent's; identical lines are
separate tasks with distinct ids, the same ones each time the file is read.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from trajectories import unplayed

from rayrollout.api.collect import plan_collect
from rayrollout.data.config import RunConfig
from rayrollout.data.responses import seed_body
from rayrollout.data.schema import Trajectory, trajectory_arrow_schema
from rayrollout.data.tasks import UNSUPPORTED, InvalidTaskError, iter_task_rows

# The features rayrollout refuses, as each refusal names them after "UNSUPPORTED: ".
AUDIO = "audio input"

# Every dataset of 0.7.0 that is refused, and the one reason all its rows are refused for.
# aviary, toolsandbox and terminal_bench_4 are read: their /seed_session answers the first
# observation (test_nemo_gym_seeded.py). gdpval, scicode and legal_agent_bench (an agent
# harness writes the prompt) and nemo_user_sim (a simulated user opens the conversation)
# are read as tasks of the nemo_gym agent. multichallenge repeats a line byte for byte.
REFUSED = {"asr_with_pc": AUDIO}
DATASETS = 145
AGENT_WRITTEN = {"gdpval", "scicode", "legal_agent_bench", "nemo_user_sim"}


def read_dataset(path: Path) -> tuple[list[tuple[dict[str, Any], Any]], list[InvalidTaskError]]:
    """Every row of one file through collect's reading path: ``(row, task)`` pairs read, in
    order, and the errors of the others."""
    config = RunConfig.model_validate(
        {
            "environment": "ng",
            "environments": {"ng": {"url": "http://127.0.0.1:9"}},  # never asked: no probe
            "skip_invalid": True,
            "output": {"dir": str(path.parent / "never-written")},
            # Agent-written rows play through the nemo_gym agent, whose required settings the
            # plan checks before the run (never contacted here).
            "agent_settings": {
                "nemo_gym": {"args": {"url": "http://127.0.0.1:9", "gateway_port": 9}}
            },
        }
    )
    plan = plan_collect(path, config)
    tasks = list(plan.tasks)
    refused = [reject for reject, _ in plan.rejects]
    lines = {exc.line for exc in refused}
    rows = [row for line, row, _ in iter_task_rows(path) if line not in lines]
    assert len(rows) == len(tasks), f"{path}: {len(rows)} rows, {len(tasks)} tasks"
    return list(zip(rows, tasks, strict=True)), refused


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
        ids = [task.task_id for _, task in read]
        if len(set(ids)) != len(ids):
            problems.append(f"{name}: task ids repeat: {ids}")
        if ids != [task.task_id for _, task in read_dataset(path)[0]]:
            problems.append(f"{name}: task ids differ when the file is read again")
        written = {task.agent for _, task in read if task.opening == "agent"}
        if name in AGENT_WRITTEN and (written != {"nemo_gym"} or len(read) == 0):
            problems.append(f"{name}: not every row is the nemo_gym agent's: {written}")
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
    assert counts["read"] >= DATASETS - 1
    # multichallenge repeats its third line twice, byte for byte: three tasks, as NeMo Gym
    # plays them, the copies numbered by their occurrence.
    path = ng_src / "resources_servers" / "multichallenge" / "data" / "example.jsonl"
    lines = path.read_bytes().splitlines()
    assert lines[2] == lines[3] == lines[4]
    ids = [task.task_id for _, task in read_dataset(path)[0]]
    assert ids == ["1", "2", "3", "3#1", "3#2"]
    assert json.loads(lines[4])["task_id"] == 3

    # task.fields reaches a Parquet output file and comes back as it went in.
    table = pa.Table.from_pylist(
        [t.to_row() for t in trajectories], schema=trajectory_arrow_schema()
    )
    pq.write_table(table, tmp_path / "trajectories.parquet")
    back = pq.read_table(tmp_path / "trajectories.parquet").to_pylist()
    assert [Trajectory.from_row(row).task_fields for row in back] == [
        t.task_fields for t in trajectories
    ]
