import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayrollout.data.tasks import InvalidTaskError, parse_task_row, read_tasks

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


def DEEP_ROW(depth):  # noqa: N802  (reads as a table entry)
    return '{"prompt": "hi", "environment": "echo", "x": ' + "[" * depth + "]" * depth + "}"


def SAMPLING_ROW(name, value):  # noqa: N802
    return json.dumps({"prompt": "hi", "environment": "echo", "sampling": {name: value}})


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
        # Hostile rows: nesting past the limit (and past what Python's JSON reader follows),
        # unbounded sampling numbers, control characters in ids.
        (DEEP_ROW(65), None, "nested deeper than 64 levels"),
        (DEEP_ROW(100_000), None, "nested deeper than 64 levels"),
        (SAMPLING_ROW("max_tokens", 10**30), "sampling.max_tokens", "less than or equal to"),
        (SAMPLING_ROW("max_tokens", 1e30), "sampling.max_tokens", "maximum size"),
        (SAMPLING_ROW("temperature", -0.5), "sampling.temperature", "greater than or equal"),
        (SAMPLING_ROW("temperature", 1e9), "sampling.temperature", "less than or equal to 10"),
        (SAMPLING_ROW("top_p", 1.5), "sampling.top_p", "less than or equal to 1"),
        (SAMPLING_ROW("seed", 2**70), "sampling.seed", "less than or equal to"),
        (
            '{"prompt": "hi", "environment": "echo", "task_id": "a\\u0000b"}',
            "task_id",
            "task_id must not contain control characters; found '\\x00' at index 1",
        ),
        (
            '{"prompt": "hi", "environment": "ec\\nho"}',
            "environment",
            "environment must not contain control characters",
        ),
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
    rows = [NEMO_GYM_ROW | {"expected_answer": answer} for answer in ("sunny", "rain", "snow")]
    path = write_lines(tmp_path / "tasks.jsonl", [json.dumps(row) for row in rows])
    tasks = list(read_tasks(path, default_environment="weather"))
    assert [t.environment for t in tasks] == ["weather"] * 3
    assert len({t.task_id for t in tasks}) == 3
    again = parse_task_row(NEMO_GYM_ROW, default_environment="weather", line=1)
    assert again.task_id == tasks[0].task_id  # same content and line, same id (--resume)


def test_a_repeated_task_id_is_an_error_naming_both_lines(tmp_path):
    rows = [
        {"task_id": "a", "prompt": "first", "environment": "echo"},
        {"task_id": "b", "prompt": "other", "environment": "echo"},
        {"task_id": "a", "prompt": "second", "environment": "echo"},  # another prompt
        {"task_id": "b", "prompt": "other", "environment": "echo"},  # an exact copy
        {"prompt": "no id", "environment": "echo"},
        {"prompt": "no id", "environment": "echo"},  # same content: the same derived id
    ]
    path = write_lines(tmp_path / "tasks.jsonl", [json.dumps(row) for row in rows])
    with pytest.raises(InvalidTaskError) as caught:
        list(read_tasks(path))
    print(f"\nDUPLICATE {caught.value}")
    assert str(caught.value) == (
        "tasks.jsonl line 3, field 'task_id': task_id 'a' is also on line 1, with different "
        "content; task ids must be unique: give one of the two rows another task_id"
    )
    errors = []  # --skip-invalid: the later row of each pair goes to the rejects
    kept = list(read_tasks(path, on_invalid=lambda exc, raw: errors.append((exc, raw))))
    assert [t.prompt[0].content for t in kept] == ["first", "other", "no id"]
    lines = [(exc.line, exc.field) for exc, _ in errors]
    assert lines == [(3, "task_id"), (4, "task_id"), (6, "task_id")]
    assert "repeats line 2 exactly; remove the copy" in errors[1][0].message
    assert errors[0][1] == json.dumps(rows[2])


def test_a_row_over_the_size_limit_is_an_error_naming_its_line(tmp_path, monkeypatch):
    from rayrollout.data import tasks as tasks_module

    monkeypatch.setattr(tasks_module, "MAX_ROW_BYTES", 100)
    big = json.dumps({"prompt": "x" * 200, "environment": "echo"})
    path = write_lines(tmp_path / "tasks.jsonl", ['{"prompt": "ok", "environment": "echo"}', big])
    errors = []
    assert len(list(read_tasks(path, on_invalid=lambda exc, raw: errors.append(exc)))) == 1
    assert str(errors[0]).startswith("tasks.jsonl line 2: row is 2")
    assert "over the 100-byte limit" in str(errors[0])


def test_in_memory_rows_are_held_to_the_same_limits():
    deep: dict = {}
    node = deep
    for _ in range(5_000):  # past Python's recursion limit, were it walked recursively
        node["x"] = node = {}
    with pytest.raises(InvalidTaskError, match="nested deeper than 64 levels"):
        parse_task_row({"prompt": "hi", "environment": "echo", "deep": deep})


def test_parquet_tasks_stream_with_row_numbers(tmp_path):
    rows = [{"prompt": f"q{i}", "environment": "echo", "task_id": f"t{i}"} for i in range(2500)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tasks.parquet", row_group_size=700)
    tasks = list(read_tasks(tmp_path / "tasks.parquet"))
    assert [t.task_id for t in tasks] == [f"t{i}" for i in range(2500)]
