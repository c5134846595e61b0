import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayrollout.tasks import InvalidTaskError, parse_task_row, read_tasks

NEMO_GYM_ROW = {
    "responses_create_params": {
        "input": [
            {"role": "developer", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "input_text", "text": "what's it like in sf?"}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": True,
            }
        ],
        "temperature": 0.5,
    },
    "agent_ref": {"type": "responses_api_agents", "name": "simple_weather_simple_agent"},
    "expected_answer": "sunny",
}


def write_lines(path, lines):
    path.write_bytes(
        b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n"
    )
    return path


def test_own_format_row_becomes_a_task_with_extra_fields():
    task = parse_task_row({"prompt": "2+2?", "environment": "math", "expected_answer": "4"})
    assert task.prompt[0].role == "user" and task.prompt[0].content == "2+2?"
    assert task.fields == {"expected_answer": "4"}
    assert len(task.task_id) == 16


def test_nemo_gym_row_is_read_as_it_is():
    task = parse_task_row(NEMO_GYM_ROW, default_environment="weather")
    assert [m.role for m in task.prompt] == ["system", "user"]
    assert task.prompt[1].content == "what's it like in sf?"
    assert task.tools[0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": True,
        },
    }
    assert task.sampling.temperature == 0.5
    assert task.fields["expected_answer"] == "sunny"
    assert task.fields["responses_create_params"] == NEMO_GYM_ROW["responses_create_params"]
    assert task.environment == "weather"


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        ('{"prompt": "hi", "environment": "echo"', None, "malformed JSON"),
        ('{"environment": "echo", "expected_answer": "1"}', "prompt", "missing"),
        ('{"prompt": "", "environment": "echo"}', "prompt", "empty prompt"),
        ('{"prompt": "hi", "environment": "nowhere"}', "environment", "unknown environment"),
        ('{"prompt": 42, "environment": "echo"}', "prompt", "must be a string or a list"),
        (
            '{"prompt": "hi", "environment": "echo", "sampling": {"temperature": "hot"}}',
            "sampling.temperature",
            "valid number",
        ),
        ('{"prompt": "hi", "environment": "echo", "task_id": ["a"]}', "task_id", "valid string"),
        ("[1, 2]", None, "must be a JSON object"),
        (b'{"prompt": "caf\xe9", "environment": "echo"}', None, "not valid UTF-8"),
    ],
)
def test_bad_rows_get_an_error_naming_line_and_field(tmp_path, line, field, message):
    path = write_lines(tmp_path / "tasks.jsonl", ['{"prompt": "ok", "environment": "echo"}', line])
    errors = []
    tasks = list(
        read_tasks(
            path,
            check_environment=lambda name: name == "echo",
            on_invalid=lambda exc, raw: errors.append(exc),
        )
    )
    assert len(tasks) == 1
    [error] = errors
    assert error.line == 2
    assert error.field == field
    assert message in error.message
    assert "tasks.jsonl line 2" in str(error)


def test_bad_row_raises_when_not_skipping(tmp_path):
    path = write_lines(tmp_path / "tasks.jsonl", ['{"prompt": "ok"}'])
    with pytest.raises(InvalidTaskError, match="line 1, field 'environment'"):
        list(read_tasks(path))


def test_default_environment_fills_rows_that_name_none(tmp_path):
    path = write_lines(tmp_path / "tasks.jsonl", [json.dumps(NEMO_GYM_ROW)] * 3)
    tasks = list(read_tasks(path, default_environment="weather"))
    assert [t.environment for t in tasks] == ["weather"] * 3
    assert len({t.task_id for t in tasks}) == 1  # same content, same id


def test_parquet_tasks_stream_with_row_numbers(tmp_path):
    rows = [{"prompt": f"q{i}", "environment": "echo", "task_id": f"t{i}"} for i in range(2500)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tasks.parquet", row_group_size=700)
    tasks = list(read_tasks(tmp_path / "tasks.parquet"))
    assert [t.task_id for t in tasks] == [f"t{i}" for i in range(2500)]
