import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trajectories import one_tool_episode

from rayrollout.data.convert import json_or_text
from rayrollout.data.schema import (
    Message,
    Task,
    Trajectory,
    Turn,
    stable_task_id,
    trajectory_arrow_schema,
)
from rayrollout.engine.chunks import ChunkRows


def make_trajectory(**overrides) -> Trajectory:
    fields = dict(
        sample_index=2,
        turns=[Turn(prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[-0.5])],
        reward=1.0,
        verification={"called": ["get_weather"], "nested": {"a": [1, 2]}},
        tools=[{"type": "function", "function": {"name": "get_weather"}}],
        task_fields={"expected_answer": "42"},
    )
    fields.update(overrides)
    exchange = ("weather in Oslo?", "get_weather", '{"city": "Oslo"}', "cold", "It is cold.")
    return one_tool_episode("t1", "weather", exchange, **fields)


def test_parquet_round_trip_keeps_every_field(tmp_path):
    trajectory = make_trajectory()
    table = pa.Table.from_pylist([trajectory.to_row()], schema=trajectory_arrow_schema())
    pq.write_table(table, tmp_path / "t.parquet")
    row = pq.read_table(tmp_path / "t.parquet").to_pylist()[0]
    assert Trajectory.from_row(row) == trajectory


def test_a_workers_chunk_carries_rows_as_the_writer_would_build_them():
    """ChunkRows builds its Arrow batch through one struct array: the table it hands the
    engine must equal the writer's own ``from_pylist`` table, and read back unchanged."""
    trajectories = [make_trajectory(), make_trajectory(reward=-2.5, error="boom", turns=[])]
    rows = [t.to_row() for t in trajectories]
    chunk = ChunkRows.from_rows(rows, [4, 1])
    expected = pa.Table.from_pylist(rows, schema=trajectory_arrow_schema())
    assert chunk.table().equals(expected)
    assert [Trajectory.from_row(r) for r in chunk.rows()] == trajectories
    assert chunk.indices == [4, 1]
    assert [s["reward"] for s in chunk.summaries] == [1.0, -2.5]
    assert ChunkRows.from_rows([], []).table().num_rows == 0


def test_jsonl_row_reads_back_as_the_same_trajectory():
    trajectory = make_trajectory()
    line = json.dumps(trajectory.to_row(), default=str)
    assert Trajectory.from_row(json.loads(line)) == trajectory


def test_arrow_schema_uses_compact_types_for_tokens():
    schema = trajectory_arrow_schema()
    turn = schema.field("turns").type.value_type
    assert turn.field("prompt_token_ids").type == pa.list_(pa.int32())
    assert turn.field("logprobs").type == pa.list_(pa.float32())
    assert schema.field("verification").type == pa.string()
    assert schema.field("created_at").type == pa.timestamp("us", tz="UTC")


def test_any_finite_reward_is_kept_and_nan_or_infinity_refused():
    for reward in (-100.0, -1.0, 1.5, 3.0):
        assert Trajectory.from_row(make_trajectory(reward=reward).to_row()).reward == reward
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number"):
            make_trajectory(reward=bad)


def test_task_needs_a_system_or_user_message_with_text():
    # NeMo Gym rows whose prompt is a system message alone are valid (citation_if, tales).
    Task(task_id="x", environment="e", prompt=[Message(role="system", content="hi")])
    with pytest.raises(ValueError, match="no system or user message with text"):
        Task(task_id="x", environment="e", prompt=[Message(role="assistant", content="hi")])


def test_stable_task_id_depends_only_on_content():
    assert stable_task_id({"a": 1, "b": 2}) == stable_task_id({"b": 2, "a": 1})
    assert stable_task_id({"a": 1}) != stable_task_id({"a": 2})


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ('"sunny, 21 C"', str, "sunny, 21 C"),  # a tool's JSON string, unwrapped
        (' \n"sunny"', str, "sunny"),  # JSON may start with whitespace
        ("The weather in Oslo is fog.", str, "The weather in Oslo is fog."),  # plain text
        ('{"city": "Oslo"}', str, '{"city": "Oslo"}'),  # JSON, not a string: the text
        ('"unterminated', str, '"unterminated'),  # looks like JSON, is not
        ('"a" "b"', str, '"a" "b"'),
        ('{"city": "Oslo"}', dict, {"city": "Oslo"}),
        ('  {"n": 1}', dict, {"n": 1}),
        ('"Oslo"', dict, '"Oslo"'),
        ("[1, 2]", list, [1, 2]),
        ("", str, ""),
    ],
)
def test_json_or_text_decodes_only_text_that_holds_the_kind(text, kind, expected):
    assert json_or_text(text, kind) == expected
