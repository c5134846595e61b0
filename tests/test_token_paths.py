"""Every way a run's rows leave it carries each token's version, which tokens a constraint
forced and the model's own logprobs, exactly as the rows on disk hold them: the service's
stream (framed by ``Batch``, read by the client), a service's journal restored after its
engine died, and ``CollectResult.dataset()`` (Ray Data over Parquet and JSONL parts).
The exports (``rayrollout export``) hold messages, not tokens, and read no token column.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from rayrollout.data.schema import Message, Trajectory, Turn

PER_TOKEN = ("completion_token_ids", "logprobs", "token_versions", "forced", "model_logprobs")


def cut_trajectory(task_id: str = "t") -> Trajectory:
    """Two turns: a forced tool call an update cut after 2 tokens (version 4, then 5), and an
    answer under version 5. Logprobs are dyadic, so float32 on disk holds them exactly."""
    return Trajectory(
        task_id=task_id,
        sample_index=0,
        group_id=task_id,
        environment="math",
        messages=[Message(role="user", content="What is 2 + 3?")],
        turns=[
            Turn(
                prompt_token_ids=[1, 2, 3],
                completion_token_ids=[10, 11, 12, 13, 14],
                logprobs=[0.0, -0.5, 0.0, -0.25, -0.125],
                forced=[True, False, True, False, False],
                model_logprobs=[-5.5, -0.5, -17.25, -0.25, -0.125],
                token_versions=[4, 4, 5, 5, 5],
                policy_version=4,
            ),
            Turn(
                prompt_token_ids=[1, 2, 3, 10, 11, 12, 13, 14, 20],
                completion_token_ids=[30, 31],
                logprobs=[-1.0, -2.0],
                model_logprobs=[-1.0, -2.0],
                token_versions=[5, 5],
                policy_version=5,
                extends_previous=True,
            ),
        ],
        policy_version=4,
    )


def per_token(turns: list[Any]) -> list[dict[str, list[Any]]]:
    """The per-token columns of each turn, from a schema, client or plain-dict turn."""
    out = []
    for turn in turns:
        get = turn.get if isinstance(turn, dict) else lambda k, t=turn: getattr(t, k)
        out.append({k: list(get(k)) for k in PER_TOKEN})
    return out


EXPECTED = per_token(cut_trajectory().turns)


def test_the_stream_hands_the_client_each_tokens_version_forced_and_model_logprob():
    from rayrollout.api.service.batches import Batch
    from rayrollout.client.models import Limits, StreamedTrajectory

    limits = Limits(
        max_buffered_rows=8,
        max_open_batches=1,
        max_tasks_per_submit=8,
        max_samples_per_task=8,
        max_body_mb=1,
    )
    batch = Batch("b", [], 1, 1, False, "", [], limits)
    row = cut_trajectory().to_row()
    batch.add([("t", 0, orjson.dumps(row, default=str))])  # as the engine encodes a row
    (line,) = batch.lines
    item = StreamedTrajectory.model_validate(json.loads(line))
    assert per_token(item.trajectory.turns) == EXPECTED
    # ...and the trainer adapters' flattening of the client's row keeps them aligned.
    from rayrollout.integrations.sequences import ENVIRONMENT_VERSION, flatten

    sequence = flatten(item.trajectory, mask_forced=True)
    model = [v for v in sequence.token_versions if v != ENVIRONMENT_VERSION]
    assert model == [4, 4, 5, 5, 5, 5, 5]
    assert [m for m, f in zip(sequence.mask, sequence.forced, strict=True) if f] == [0, 0]


def test_a_journaled_row_restored_after_its_engine_died_keeps_them():
    row = orjson.loads(orjson.dumps(cut_trajectory().to_row(), default=str))
    restored = Trajectory.from_row(row).to_row()  # what StreamingAPI.restore_rows writes
    assert per_token(restored["turns"]) == EXPECTED


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_ray_data_reads_them_from_the_parts(tmp_path, ray_session, fmt):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayrollout import trajectory_arrow_schema
    from rayrollout.api.rollout_engine import CollectResult

    rows = [cut_trajectory(f"t{i}").to_row() for i in range(3)]
    part = tmp_path / f"part-00000.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows, schema=trajectory_arrow_schema()), part)
    else:
        part.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    summary: Any = SimpleNamespace(parts=[str(part)])
    read = CollectResult(tmp_path, fmt, summary).dataset().take_all()
    assert sorted(r["task_id"] for r in read) == ["t0", "t1", "t2"]
    for r in read:
        assert per_token(list(r["turns"])) == EXPECTED, r["task_id"]


def test_the_exports_read_no_token_column_and_their_page_says_where_tokens_are():
    """The export kinds write text rows (TRL SFT/DPO, NeMo Gym responses, verl prompts):
    their reader leaves out ``turns``, so no token, version or logprob reaches them."""
    from rayrollout.data.export import reading

    assert "turns" in reading._SKIPPED_COLUMNS
    page = (Path(__file__).resolve().parents[1] / "docs/how-to/exports.md").read_text()
    assert all(name in page for name in ("token_versions", "forced", "model_logprobs"))
