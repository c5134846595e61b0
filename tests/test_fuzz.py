"""Property-based fuzzing of the two places untrusted input enters: task files and the
model's tool-call arguments.

Task rows: random bytes, random JSON values and rows with wrong types in every field never
crash the reader; each bad row gets one ``InvalidTaskError`` naming its line and, for a
JSON object, the field. Tool calls: any name and any argument string come back as a
``ToolResult``, never an exception.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from fixture_envs import EchoEnv
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rayrollout.data.schema import Task
from rayrollout.data.tasks import InvalidTaskError, parse_task_row, read_tasks
from rayrollout.envkit import Environment, Episode, ToolResult, Verification, tool

FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
KNOWN_ENVIRONMENTS = {"echo", "weather"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["user", "system", "developer", "assistant", "tool"])
            | json_values,
            "content": st.text(max_size=20)
            | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text()}))
            | json_values,
        },
    )
    | json_values,
    max_size=3,
)
tools = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.just("function"),
            "name": st.text(max_size=10) | json_values,
            "parameters": json_values,
            "function": json_values,
        },
    )
    | json_values,
    max_size=3,
)
own_rows = st.fixed_dictionaries(
    {},
    optional={
        "task_id": st.text(max_size=10) | json_values,
        "environment": st.sampled_from(sorted(KNOWN_ENVIRONMENTS) + ["atlantis", ""]) | json_values,
        "prompt": st.text(max_size=30) | messages | json_values,
        "tools": tools | json_values,
        "sampling": st.fixed_dictionaries(
            {}, optional={"temperature": json_values, "max_tokens": json_values}
        )
        | json_values,
        "expected_answer": json_values,
    },
)
nemo_gym_rows = st.fixed_dictionaries(
    {
        "responses_create_params": st.fixed_dictionaries(
            {},
            optional={
                "input": st.text(max_size=20) | messages | json_values,
                "tools": tools | json_values,
                "temperature": json_values,
                "max_output_tokens": json_values,
            },
        )
        | json_values
    },
    optional={"environment": st.sampled_from(["echo", "atlantis"]) | json_values},
)
rows = own_rows | nemo_gym_rows
lines = (
    rows.map(lambda row: json.dumps(row).encode())
    | json_values.map(lambda value: json.dumps(value).encode())
    | st.binary(max_size=40).map(lambda raw: raw.replace(b"\n", b" "))
)


def read_all(content: bytes) -> tuple[list[Task], list[InvalidTaskError]]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tasks.jsonl"
        path.write_bytes(content)
        errors: list[InvalidTaskError] = []
        tasks = list(
            read_tasks(
                path,
                check_environment=lambda name: name in KNOWN_ENVIRONMENTS,
                on_invalid=lambda exc, raw: errors.append(exc),
            )
        )
    return tasks, errors


@FUZZ
@given(st.lists(lines, min_size=1, max_size=8))
@example([b'{"prompt": [{"role": ["unhashable"]}], "environment": "echo"}'])
@example([b'{"prompt": "hi", "environment": "echo", "tools": [{"name": "t", "parameters": 1}]}'])
@example([b"\xff\xfe not utf-8", b'{"prompt": "   "}', b"[]", b"{" * 10_000])
@example([b'{"responses_create_params": {"input": []}, "environment": "echo"}'])
def test_every_bad_task_row_gets_one_error_naming_its_line_and_field(file_lines):
    tasks, errors = read_all(b"\n".join(file_lines) + b"\n")
    non_blank = [i for i, line in enumerate(file_lines, start=1) if line.strip()]
    assert len(tasks) + len(errors) == len(non_blank)
    assert len({e.line for e in errors}) == len(errors)  # one error per bad row
    for error in errors:
        assert error.line in non_blank
        line = file_lines[error.line - 1]
        assert str(error).startswith(f"tasks.jsonl line {error.line}")
        assert error.message
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):  # a row we could read: the problem is in a field
            assert error.field, f"no field named for {line!r}: {error}"
            assert f"field '{error.field}'" in str(error)
    for task in tasks:
        assert task.environment in KNOWN_ENVIRONMENTS
        # A NeMo Gym row whose opening its agent writes (``opening: agent``) has no prompt.
        assert (task.prompt or task.opening == "agent") and task.task_id


@FUZZ
@given(json_values)
def test_parsing_any_json_object_raises_nothing_but_invalid_task_error(value):
    row = value if isinstance(value, dict) else {"prompt": value}
    try:
        task = parse_task_row(row, default_environment="echo", source="fuzz", line=3)
    except InvalidTaskError as exc:
        assert exc.line == 3 and exc.field
    else:
        assert task.prompt


@FUZZ
@given(
    depth=st.integers(min_value=1, max_value=20_000),
    opener=st.sampled_from(["[", '{"k": ']),
    field=st.sampled_from(["x", "prompt", "tools", "sampling", "responses_create_params"]),
)
def test_a_row_nested_to_any_depth_is_a_row_error_naming_its_line_never_a_crash(
    depth, opener, field
):
    closer = "]" if opener == "[" else "}"
    deep = opener * depth + "1" + closer * depth
    line = '{"prompt": "hi", "environment": "echo", "%s": %s}' % (field, deep)  # noqa: UP031
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tasks.jsonl"
        path.write_text('{"prompt": "ok", "environment": "echo"}\n' + line + "\n")
        errors: list[InvalidTaskError] = []
        tasks = list(read_tasks(path, on_invalid=lambda exc, raw: errors.append(exc)))
    assert tasks[0].prompt[0].content == "ok"
    if depth + 1 > 64:  # the row itself is one level
        assert [(e.line, e.field) for e in errors] == [(2, None)]
        assert "nested deeper than 64 levels" in errors[0].message
    else:
        assert len(tasks) + len(errors) == 2 and all(e.line == 2 for e in errors)


def test_a_tool_schema_that_is_not_json_schema_is_named_by_line_and_field(tmp_path):
    path = tmp_path / "tasks.jsonl"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
    ok = {"prompt": "hi", "environment": "echo"}
    path.write_text(json.dumps(ok) + "\n" + json.dumps({**ok, "tools": [tool]}) + "\n")
    tasks, errors = read_all(path.read_bytes())
    assert len(tasks) == 1
    [error] = errors
    assert (error.line, error.field) == (2, "tools[0].parameters")
    assert "not a valid JSON Schema" in error.message


class TypedEnv(Environment):
    """Tools with the argument types models get wrong: numbers, lists, optionals, enums."""

    name = "typed"

    @tool
    async def add(self, a: int, b: float = 1.5) -> float:
        """Add two numbers.

        Args:
            a: An integer.
            b: A number.
        """
        return a + b

    @tool
    async def tag(self, words: list[str], label: str | None = None) -> dict[str, Any]:
        """Label some words.

        Args:
            words: The words.
            label: An optional label.
        """
        return {"label": label, "n": len(words)}

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=0.0)


TASK = Task(task_id="fuzz", environment="echo", prompt=[{"role": "user", "content": "hi"}])
argument_strings = (
    st.text(max_size=60)
    | json_values.map(json.dumps)
    | st.dictionaries(
        st.sampled_from(["a", "b", "words", "label", "text", "other"]), json_values, max_size=4
    ).map(json.dumps)
)


@FUZZ
@given(
    env_cls=st.sampled_from([EchoEnv, TypedEnv]),
    name=st.sampled_from(["echo", "add", "tag", "missing", ""]) | st.text(max_size=10),
    arguments=argument_strings,
)
@example(env_cls=TypedEnv, name="add", arguments="[" * 100_000)
@example(env_cls=TypedEnv, name="add", arguments='{"a": 1e999}')
@example(env_cls=EchoEnv, name="echo", arguments='{"text": "\\ud800"}')
def test_any_tool_call_arguments_come_back_as_a_tool_result(env_cls, name, arguments):
    result = asyncio.run(env_cls(TASK).call_tool(name, arguments))
    assert isinstance(result, ToolResult)
    assert isinstance(result.content, str)
    if name not in {t["function"]["name"] for t in env_cls.tool_schemas()}:
        assert result.is_error and "unknown tool" in result.content
