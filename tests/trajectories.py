"""Hand-built trajectories for tests that need rows, not an engine run, and the parts they
are written to (a plain module, like ``netutil``: test files of every tier import it by name)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rayrollout.data.schema import FunctionCall, Message, Task, ToolCall, Trajectory
from rayrollout.data.writer import PartWriter


def greeting(**fields: Any) -> Trajectory:
    """The least episode: the user says 'hi', of task 't' (sample 0) in group 'g' of
    environment 'e'; ``fields`` replace any of these or set the rest (``turns``, ...)."""
    defaults: dict[str, Any] = {
        "task_id": "t",
        "sample_index": 0,
        "group_id": "g",
        "environment": "e",
        "messages": [Message(role="user", content="hi")],
    }
    return Trajectory(**{**defaults, **fields})


def write_through(
    sink: Any, rows: Iterable[Trajectory | dict[str, Any]], per_part: int
) -> list[Path]:
    """``rows`` written as a worker writes them: ``sink`` started, the rows in parts of
    ``per_part`` by a ``PartWriter``, the sink completed; the parts' paths."""
    sink.start()
    writer = PartWriter(sink, rows_per_part=per_part, flush_interval_s=3600)
    table_rows = [r.to_row() if isinstance(r, Trajectory) else r for r in rows]
    for table in writer.add(table_rows) + writer.drain():
        writer.write(table)
    sink.complete()
    return writer.paths


def one_tool_episode(
    task_id: str,
    environment: str,
    exchange: tuple[str, str, str, str, str],
    **fields: Any,
) -> Trajectory:
    """The common episode: the user asks, the model calls one tool, reads it and answers.

    ``exchange`` is (question, tool, JSON arguments, tool result, answer); ``fields`` set the
    rest of the trajectory (``sample_index``, ``reward``, ``turns``, ...).
    """
    question, tool, arguments, result, answer = exchange
    call = ToolCall(id="call_1", function=FunctionCall(name=tool, arguments=arguments))
    messages = [
        Message(role="user", content=question),
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", tool_call_id="call_1", name=tool, content=result),
        Message(role="assistant", content=answer),
    ]
    return Trajectory(
        task_id=task_id, group_id=task_id, environment=environment, messages=messages, **fields
    )


def unplayed(task: Task) -> Trajectory:
    """The row a task gives before any model call: its prompt and its fields, sample 0."""
    return Trajectory(
        task_id=task.task_id,
        sample_index=0,
        group_id=task.task_id,
        environment=task.environment,
        messages=task.prompt,
        task_fields=task.fields,
    )
