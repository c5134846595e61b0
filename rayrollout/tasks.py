"""Task input: stream rows from JSONL or Parquet and turn each into a validated ``Task``.

Two row formats are read as they are:

* rayrollout's own: ``{"prompt": "..." | [messages], "environment"?, "task_id"?, "tools"?,
  "sampling"?, ...verifier fields}``;
* NeMo Gym's: ``{"responses_create_params": {"input": ..., "tools": [...]}, ...verifier
  fields}``, with ``developer`` messages read as ``system`` and Responses-API function tools
  converted to Chat Completions form.

Files are streamed (a JSONL line or a Parquet batch at a time), never loaded whole. A bad row
raises ``InvalidTaskError`` naming the file, the line and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow.parquet as pq
from pydantic import ValidationError

from rayrollout.schema import Message, SamplingParams, Task, stable_task_id

__all__ = ["InvalidTaskError", "iter_task_rows", "parse_task_row", "read_tasks"]

_OWN_KEYS = {"task_id", "environment", "prompt", "tools", "sampling"}
_ROLE_ALIASES = {"developer": "system"}
MAX_ROW_BYTES = 16 * 1024 * 1024


class InvalidTaskError(ValueError):
    """A task row that cannot run, with where it is and what is wrong."""

    def __init__(self, source: str, line: int, field: str | None, message: str) -> None:
        self.source, self.line, self.field, self.message = source, line, field, message
        where = f"{source} line {line}" + (f", field '{field}'" if field else "")
        super().__init__(f"{where}: {message}")

    def to_record(self, raw: str | None = None) -> dict[str, Any]:
        """The reject-file row for this error."""
        return {
            "source": self.source,
            "line": self.line,
            "field": self.field,
            "error": self.message,
            "raw": raw,
        }


def iter_task_rows(
    path: str | Path,
) -> Iterator[tuple[int, dict[str, Any] | InvalidTaskError, str | None]]:
    """Yield ``(line, row or error, raw text)`` for each row of a JSONL or Parquet file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tasks file not found: {path}")
    if path.suffix == ".parquet":
        yield from _iter_parquet(path)
    else:
        yield from _iter_jsonl(path)


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any] | InvalidTaskError, str | None]]:
    source = path.name
    with path.open("rb") as file:
        for line_no, raw_bytes in enumerate(file, start=1):
            if not raw_bytes.strip():
                continue
            if len(raw_bytes) > MAX_ROW_BYTES:
                yield (
                    line_no,
                    InvalidTaskError(
                        source,
                        line_no,
                        None,
                        f"row is {len(raw_bytes)} bytes, over the {MAX_ROW_BYTES}-byte limit",
                    ),
                    None,
                )
                continue
            try:
                raw = raw_bytes.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                yield (
                    line_no,
                    InvalidTaskError(
                        source, line_no, None, f"not valid UTF-8 (byte {exc.start}): {exc.reason}"
                    ),
                    raw_bytes.decode("utf-8", errors="replace"),
                )
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                yield (
                    line_no,
                    InvalidTaskError(
                        source, line_no, None, f"malformed JSON: {exc.msg} at column {exc.colno}"
                    ),
                    raw,
                )
                continue
            if not isinstance(row, dict):
                yield (
                    line_no,
                    InvalidTaskError(
                        source,
                        line_no,
                        None,
                        f"a row must be a JSON object, got {type(row).__name__}",
                    ),
                    raw,
                )
                continue
            yield line_no, row, raw


def _iter_parquet(
    path: Path,
) -> Iterator[tuple[int, dict[str, Any] | InvalidTaskError, str | None]]:
    line_no = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            line_no += 1
            yield line_no, {k: v for k, v in row.items() if v is not None}, None


def parse_task_row(
    row: dict[str, Any],
    *,
    default_environment: str | None = None,
    source: str = "<tasks>",
    line: int = 0,
) -> Task:
    """Build a ``Task`` from a row in either format; raises ``InvalidTaskError``."""

    def fail(field: str | None, message: str) -> InvalidTaskError:
        return InvalidTaskError(source, line, field, message)

    if "responses_create_params" in row:
        data = _from_nemo_gym(row, fail)
    elif "prompt" in row:
        data = {k: row[k] for k in _OWN_KEYS if k in row}
        data["prompt"] = _messages(row["prompt"], "prompt", fail)
        data["fields"] = {k: v for k, v in row.items() if k not in _OWN_KEYS}
    else:
        raise fail(
            "prompt",
            "missing: a row needs 'prompt' (or NeMo Gym's 'responses_create_params' with 'input')",
        )
    if "tools" in data and data["tools"] is not None:
        data["tools"] = _chat_tools(data["tools"], fail)
    data.setdefault("environment", row.get("environment") or default_environment)
    if not data["environment"]:
        raise fail("environment", "missing: name it in the row or pass --env NAME")
    if "task_id" not in data or data["task_id"] in (None, ""):
        data["task_id"] = stable_task_id(row)
    elif isinstance(data["task_id"], int):
        data["task_id"] = str(data["task_id"])
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise fail(field, f"{first['msg']} (got {_short(first.get('input'))})") from None


def _from_nemo_gym(
    row: dict[str, Any], fail: Callable[[str | None, str], InvalidTaskError]
) -> dict[str, Any]:
    params = row["responses_create_params"]
    if not isinstance(params, dict):
        raise fail("responses_create_params", "must be an object")
    if "input" not in params:
        raise fail("responses_create_params.input", "missing: the prompt messages")
    data: dict[str, Any] = {
        "prompt": _messages(params["input"], "responses_create_params.input", fail),
        "fields": {k: v for k, v in row.items() if k not in ("task_id", "environment")},
    }
    for key in ("task_id", "environment"):
        if key in row:
            data[key] = row[key]
    if params.get("tools") is not None:
        data["tools"] = params["tools"]
    sampling = {
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "max_tokens": params.get("max_output_tokens"),
    }
    if any(v is not None for v in sampling.values()):
        try:
            data["sampling"] = SamplingParams.model_validate(sampling)
        except ValidationError as exc:
            raise fail("responses_create_params", exc.errors()[0]["msg"]) from None
    return data


def _messages(
    value: Any, field: str, fail: Callable[[str | None, str], InvalidTaskError]
) -> list[Message]:
    if isinstance(value, str):
        if not value.strip():
            raise fail(field, "empty prompt")
        return [Message(role="user", content=value)]
    if not isinstance(value, list):
        raise fail(field, f"must be a string or a list of messages, got {type(value).__name__}")
    messages = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or "role" not in item:
            raise fail(f"{field}[{i}]", "must be a message object with 'role' and 'content'")
        if not isinstance(item["role"], str):
            raise fail(f"{field}[{i}].role", f"must be a string, got {_short(item['role'])}")
        role = _ROLE_ALIASES.get(item["role"], item["role"])
        if role not in ("system", "user", "assistant"):
            raise fail(f"{field}[{i}].role", f"unsupported role {item['role']!r}")
        messages.append(
            Message(role=role, content=_text(item.get("content"), f"{field}[{i}].content", fail))
        )
    if not messages:
        raise fail(field, "empty prompt: no messages")
    return messages


def _text(content: Any, field: str, fail: Callable[[str | None, str], InvalidTaskError]) -> str:
    """Message content as text: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        if len(parts) == len(content):
            return "".join(parts)
    raise fail(field, f"must be text or a list of text parts, got {_short(content)}")


def _chat_tools(
    tools: Any, fail: Callable[[str | None, str], InvalidTaskError]
) -> list[dict[str, Any]]:
    """Tool schemas in Chat Completions form, accepting the Responses-API form too."""
    if not isinstance(tools, list):
        raise fail("tools", f"must be a list of tool schemas, got {type(tools).__name__}")
    out = []
    for i, spec in enumerate(tools):
        if not isinstance(spec, dict):
            raise fail(f"tools[{i}]", "must be an object")
        function = spec.get("function", spec)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise fail(f"tools[{i}].name", "missing: every tool needs a name")
        params = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise fail(f"tools[{i}].parameters", "must be a JSON Schema object")
        try:
            jsonschema.validators.validator_for(params).check_schema(params)
        except jsonschema.SchemaError as exc:
            raise fail(
                f"tools[{i}].parameters", f"not a valid JSON Schema: {_short(exc.message)}"
            ) from None
        chat = {
            "name": function["name"],
            "description": function.get("description", ""),
            "parameters": params,
        }
        if "strict" in function:
            chat["strict"] = function["strict"]
        out.append({"type": "function", "function": chat})
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_tasks(
    path: str | Path,
    *,
    default_environment: str | None = None,
    check_environment: Callable[[str], bool] | None = None,
    on_invalid: Callable[[InvalidTaskError, str | None], None] | None = None,
) -> Iterator[Task]:
    """Stream validated tasks from a file.

    Args:
        path: A ``.jsonl`` (or ``.json`` lines) or ``.parquet`` file of task rows.
        default_environment: Environment for rows that name none (``--env``).
        check_environment: Returns whether an environment name is known; unknown ones are
            errors of field 'environment'.
        on_invalid: Called with each bad row's error (and raw text) instead of raising; the
            rest of the file still streams (``--skip-invalid``).
    """
    source = Path(path).name
    for line, row, raw in iter_task_rows(path):
        try:
            if isinstance(row, InvalidTaskError):
                raise row
            task = parse_task_row(
                row, default_environment=default_environment, source=source, line=line
            )
            if check_environment is not None and not check_environment(task.environment):
                raise InvalidTaskError(
                    source,
                    line,
                    "environment",
                    f"unknown environment {task.environment!r} (see `rayrollout env list`)",
                )
        except InvalidTaskError as exc:
            if on_invalid is None:
                raise
            on_invalid(exc, raw)
            continue
        yield task
