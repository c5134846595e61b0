"""Task input: stream rows from JSONL or Parquet and turn each into a validated ``Task``.

Two row formats are read as they are:

* rayrollout's own: ``{"prompt": "..." | [messages], "environment"?, "task_id"?, "tools"?,
  "sampling"?, ...verifier fields}``;
* NeMo Gym's: ``{"responses_create_params": {"input": ..., "tools": [...]}, ...verifier
  fields}``, with ``developer`` messages read as ``system``, ``instructions`` folded into the
  leading system message, ``function_call``/``function_call_output`` items read as the
  assistant's tool calls and the tools' answers, and Responses-API function tools converted
  to Chat Completions form. Its two envelopes are unwrapped first: the materialized task
  ``{"task_id": {"taskset", "task_id"}, "task_input": {...}}`` and NeMo UserSim's
  ``{"task_id", "resolved_row"}``.

A NeMo Gym row keeps every key in ``task.fields``, verbatim (``responses_create_params``,
``task_id`` and ``environment`` included): rayrollout sends the whole row back to the
resources server's ``/seed_session`` and ``/verify``, whose verifiers read what they like
from it. What rayrollout cannot run is refused with an ``InvalidTaskError`` whose message
starts "NeMo Gym feature not supported: <feature>" (see ``UNSUPPORTED``), never dropped
silently. NeMo Gym's shapes are read in ``nemo_gym_rows``; this module reads files, tells
the formats apart and validates the ``Task``.

Files are streamed (a JSONL line or a Parquet batch at a time), never loaded whole. A bad row
raises ``InvalidTaskError`` naming the file, the line and the field.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow.parquet as pq
from pydantic import ValidationError

from rayrollout.data.nemo_gym_rows import (
    UNSUPPORTED,
    Fail,
    from_nemo_gym,
    prompt_messages,
    short,
    unwrap,
    usersim_refusal,
)
from rayrollout.data.schema import Task, stable_task_id
from rayrollout.errors import InputError

__all__ = [
    "MAX_DEPTH",
    "MAX_ROW_BYTES",
    "UNSUPPORTED",
    "InvalidTaskError",
    "UniqueTaskIds",
    "iter_task_rows",
    "nesting_depth",
    "parse_task_row",
    "read_tasks",
]

_OWN_KEYS = {"task_id", "environment", "prompt", "tools", "sampling", "agent"}
MAX_ROW_BYTES = 16 * 1024 * 1024
"""The largest task row (a JSONL line) read; a larger one is a row error."""
MAX_DEPTH = 64
"""How deeply a task row may nest objects and lists; a deeper one is a row error (Python's
own JSON reader and the validators recurse, and would fail with no line named)."""


class InvalidTaskError(InputError, ValueError):
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
                message = f"row is {len(raw_bytes)} bytes, over the {MAX_ROW_BYTES}-byte limit"
                yield line_no, InvalidTaskError(source, line_no, None, message), None
                continue
            try:
                raw = raw_bytes.decode("utf-8").rstrip("\r\n")
                row = json.loads(raw)
            except UnicodeDecodeError as exc:
                message = f"not valid UTF-8 (byte {exc.start}): {exc.reason}"
                raw = raw_bytes.decode("utf-8", errors="replace")
                yield line_no, InvalidTaskError(source, line_no, None, message), raw
                continue
            except json.JSONDecodeError as exc:
                message = f"malformed JSON: {exc.msg} at column {exc.colno}"
                yield line_no, InvalidTaskError(source, line_no, None, message), raw
                continue
            except RecursionError:  # nested past what Python's JSON reader can follow
                yield line_no, InvalidTaskError(source, line_no, None, _too_deep()), raw
                continue
            if not isinstance(row, dict):
                message = f"a row must be a JSON object, got {type(row).__name__}"
                yield line_no, InvalidTaskError(source, line_no, None, message), raw
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


def _too_deep() -> str:
    return (
        f"nested deeper than {MAX_DEPTH} levels of objects and lists; flatten the row "
        "(or move the deep value into a JSON string field)"
    )


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value`` nests dicts and lists (a scalar is 0), counted without recursion
    and stopping once past ``limit`` (so a hostile row costs no more than a fair one)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def parse_task_row(
    row: dict[str, Any],
    *,
    default_environment: str | None = None,
    source: str = "<tasks>",
    line: int = 0,
) -> Task:
    """Build a ``Task`` from a row in either format; raises ``InvalidTaskError``.

    Our own fields come from a NeMo Gym row as follows, while ``fields`` keeps the row whole:
    ``task_id`` is the row's when it is a string or an integer (else derived from the
    content); ``environment`` is the row's only when it is a string, because NeMo Gym
    datasets use a key of that name for verifier data (``indirect_prompt_injection``: an
    object describing the simulated world), which names no rayrollout environment.
    """

    def fail(field: str | None, message: str) -> InvalidTaskError:
        return InvalidTaskError(source, line, field, message)

    if nesting_depth(row) > MAX_DEPTH:
        raise fail(None, _too_deep())
    flat, envelope_id, usersim = unwrap(row, fail)
    nemo_gym = "responses_create_params" in flat
    if nemo_gym:
        data = from_nemo_gym(flat, fail)
    elif "prompt" in flat:
        data = {k: flat[k] for k in _OWN_KEYS if k in flat}
        data["prompt"] = prompt_messages(flat["prompt"], "prompt", fail)
        data["fields"] = {k: v for k, v in flat.items() if k not in _OWN_KEYS}
    elif usersim is not None:
        raise fail(usersim, usersim_refusal())
    elif flat is not row:
        raise fail(
            "task_input",
            "missing: the materialized task's task_input holds no prompt "
            "('responses_create_params' with 'input', or 'prompt')",
        )
    else:
        raise fail(
            "prompt",
            "missing: a row needs 'prompt' (or NeMo Gym's 'responses_create_params' with 'input')",
        )
    if envelope_id is not None:
        data["task_id"] = envelope_id
    if "tools" in data and data["tools"] is not None:
        data["tools"] = _chat_tools(data["tools"], fail)
    data.setdefault("environment", default_environment)
    if not data["environment"]:
        raise fail("environment", "missing: name it in the row or pass --env NAME")
    if "task_id" not in data or data["task_id"] in (None, ""):
        data["task_id"] = stable_task_id(row)
    elif isinstance(data["task_id"], int) and not isinstance(data["task_id"], bool):
        data["task_id"] = str(data["task_id"])
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        if nemo_gym and field == "prompt":
            field = "responses_create_params.input"
        message = first["msg"].removeprefix("Value error, ")  # our validators' own text
        raise fail(field, f"{message} (got {short(first.get('input'))})") from None


@functools.lru_cache(maxsize=4096)
def _schema_problem(params_json: str) -> str | None:
    """Why a tool's parameters are not a JSON Schema (None: they are), by their JSON text.

    Checking a schema costs about 0.74 ms (jsonschema's meta-schema validation), which made
    reading 20,000 NeMo Gym rows take 15 s before the first episode; a dataset's rows share
    a handful of tool sets, so each distinct schema is checked once.
    """
    params = json.loads(params_json)
    try:
        jsonschema.validators.validator_for(params).check_schema(params)
    except jsonschema.SchemaError as exc:
        return exc.message
    return None


def _chat_tools(tools: Any, fail: Fail) -> list[dict[str, Any]]:
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
        problem = _schema_problem(json.dumps(params, sort_keys=True, default=str))
        if problem is not None:
            raise fail(f"tools[{i}].parameters", f"not a valid JSON Schema: {short(problem)}")
        chat = {
            "name": function["name"],
            "description": function.get("description", ""),
            "parameters": params,
        }
        if "strict" in function:
            chat["strict"] = function["strict"]
        out.append({"type": "function", "function": chat})
    return out


class UniqueTaskIds:
    """Refuses a ``task_id`` already taken by an earlier row of the same file (or list).

    Two rows with one id would both run and write the same ``(task_id, sample_index)``
    keys, and ``--resume`` would count either as the other. A repeat with different content
    is an error naming both lines; an exact copy is an error too (not silently dropped: a
    copy usually means a file was concatenated twice, and more samples of a task are
    ``--num-repeats``). Only valid rows claim an id, so a rejected row never blocks a later
    one. Keeps 8 bytes of digest per id (about 100 bytes a task with the id itself).
    """

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, bytes]] = {}

    def check(self, task: Task, source: str, line: int) -> None:
        """Claim ``task``'s id for ``line``, or raise ``InvalidTaskError`` naming the first."""
        digest = hashlib.blake2b(task.model_dump_json().encode(), digest_size=8).digest()
        first_line, first_digest = self._seen.setdefault(task.task_id, (line, digest))
        if first_line == line:
            return
        if first_digest == digest:
            message = (
                f"task_id {task.task_id!r} repeats line {first_line} exactly; remove the copy "
                "(more samples of one task: --num-repeats)"
            )
        else:
            message = (
                f"task_id {task.task_id!r} is also on line {first_line}, with different "
                "content; task ids must be unique: give one of the two rows another task_id"
            )
        raise InvalidTaskError(source, line, "task_id", message)


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

    A row nested deeper than ``MAX_DEPTH``, a line over ``MAX_ROW_BYTES`` and a ``task_id``
    an earlier row took (``UniqueTaskIds``) are row errors like any other.
    """
    source = Path(path).name
    unique = UniqueTaskIds()
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
            unique.check(task, source, line)
        except InvalidTaskError as exc:
            if on_invalid is None:
                raise
            on_invalid(exc, raw)
            continue
        yield task
