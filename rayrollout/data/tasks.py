"""Task input; one job: a row from its bytes, JSONL or Parquet, to a checked ``Task``.

Rows stream from JSONL or Parquet and each becomes a validated ``Task``: reading a line,
parsing either format, checking its tools, its id's uniqueness; NeMo Gym's own shapes are
apart in ``nemo_gym_rows``.

Two row formats are read as they are: rayrollout's own (``prompt``, ``environment``,
``tools``, ``sampling``, verifier fields) and NeMo Gym's (``responses_create_params``, kept
whole in ``task.fields`` for its servers). Files stream a line or batch at a time, ids are
kept as digests, and ``check_rows`` is the one checker of rows from anywhere; a bad row is
an ``InvalidTaskError`` naming file, line and field. Identical NeMo Gym lines are separate
tasks, numbered as NeMo Gym numbers them; an identical row of rayrollout's format is a copy.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pyarrow.parquet as pq
from pydantic import ValidationError

from rayrollout.data.errors import InvalidTaskError, RowRefused
from rayrollout.data.images import ImageError, is_data_url, is_remote_url, resolve_image_url
from rayrollout.data.nemo_gym_rows import (
    UNSUPPORTED,
    Fail,
    from_nemo_gym,
    is_nemo_gym_task,
    prompt_messages,
    short,
    unwrap,
    usersim_task,
)
from rayrollout.data.schema import MAX_ID_LENGTH, Task, stable_task_id
from rayrollout.data.task_digests import DigestTable, digest

__all__ = [
    "MAX_DEPTH",
    "MAX_ROW_BYTES",
    "UNSUPPORTED",
    "CheckedRow",
    "InvalidTaskError",
    "SourceRow",
    "UniqueTaskIds",
    "check_rows",
    "claim_row",
    "copy_task_id",
    "iter_task_rows",
    "nesting_depth",
    "numbered_task_id",
    "parse_rows",
    "parse_task_row",
    "read_tasks",
    "row_from_line",
]

_OWN_KEYS = {"task_id", "environment", "prompt", "tools", "sampling", "agent"}
MAX_ROW_BYTES = 16 * 1024 * 1024
"""The largest task row (a JSONL line) read; a larger one is a row error."""
MAX_DEPTH = 64
"""How deeply a task row may nest objects and lists; a deeper one is a row error (Python's
own JSON reader and the validators recurse, and would fail with no line named)."""


SourceRow = tuple[str, int, "dict[str, Any] | Task | InvalidTaskError", "str | None"]
"""A row as read: ``(source, line, row or the error reading it, raw text or None)``; a row
in memory may be a ``Task`` already."""
CheckedRow = tuple[str, int, "Task | InvalidTaskError", "str | None"]
"""A row as checked: ``(source, line, task or the error, raw text or None)``."""


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


def row_from_line(
    source: str, line_no: int, raw_bytes: bytes
) -> tuple[dict[str, Any] | InvalidTaskError, str | None]:
    """A JSONL line (not blank) as a row, or the error naming why it is none, with its text.

    The one reading of a line, for a file read here and a shard read by Ray Data's workers
    (``task_shards``), so both name the same faults the same way.
    """
    if len(raw_bytes) > MAX_ROW_BYTES:
        message = f"row is {len(raw_bytes)} bytes, over the {MAX_ROW_BYTES}-byte limit"
        return InvalidTaskError(source, line_no, None, message), None
    try:
        raw = raw_bytes.decode("utf-8").rstrip("\r\n")
        row = json.loads(raw)
    except UnicodeDecodeError as exc:
        message = f"not valid UTF-8 (byte {exc.start}): {exc.reason}"
        raw = raw_bytes.decode("utf-8", errors="replace")
        return InvalidTaskError(source, line_no, None, message), raw
    except json.JSONDecodeError as exc:
        message = f"malformed JSON: {exc.msg} at column {exc.colno}"
        return InvalidTaskError(source, line_no, None, message), raw
    except RecursionError:  # nested past what Python's JSON reader can follow
        return InvalidTaskError(source, line_no, None, _too_deep()), raw
    if not isinstance(row, dict):
        message = f"a row must be a JSON object, got {type(row).__name__}"
        return InvalidTaskError(source, line_no, None, message), raw
    return row, raw


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any] | InvalidTaskError, str | None]]:
    source = path.name
    with path.open("rb") as file:
        for line_no, raw_bytes in enumerate(file, start=1):
            if raw_bytes.strip():
                yield line_no, *row_from_line(source, line_no, raw_bytes)


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
    shard: str | None = None,
    base_dir: Path | None = None,
) -> Task:
    """Build a ``Task`` from a row in either format; raises ``InvalidTaskError``.

    Images in the prompt (Chat ``image_url`` parts, Responses ``input_image`` items) are
    kept as image parts of their messages: a data URL as it is, an http(s) URL as it is
    (never fetched here), a file path read now, relative to ``base_dir`` (the task file's
    folder), into a data URL (``images.resolve_image_url``).

    Our own fields come from a NeMo Gym row as follows, while ``fields`` keeps the row whole:
    ``task_id`` is the row's when it is a string or an integer (else its content's digest
    and its ``line``, in ``shard`` if it is one of a shard set: ``numbered_task_id``);
    ``environment`` is the row's only when it is a string, because NeMo Gym datasets use a
    key of that name for verifier data (``indirect_prompt_injection``: an object describing
    the simulated world), which names no rayrollout environment. A row of our own format
    without an id gets its content's digest (``schema.stable_task_id``).
    """

    def fail(field: str | None, message: str) -> InvalidTaskError:
        return InvalidTaskError(source, line, field, message)

    if nesting_depth(row) > MAX_DEPTH:
        raise fail(None, _too_deep())
    flat, envelope_id, usersim = unwrap(row, fail)
    nemo_gym = "responses_create_params" in flat or usersim is not None
    if "responses_create_params" in flat:
        data = from_nemo_gym(flat, fail)
    elif "prompt" in flat:
        data = {k: flat[k] for k in _OWN_KEYS if k in flat}
        data["prompt"] = prompt_messages(flat["prompt"], "prompt", fail)
        data["fields"] = {k: v for k, v in flat.items() if k not in _OWN_KEYS}
    elif usersim is not None:
        data = usersim_task(row, flat)
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
        data["task_id"] = numbered_task_id(row, line, shard) if nemo_gym else stable_task_id(row)
    elif isinstance(data["task_id"], int) and not isinstance(data["task_id"], bool):
        data["task_id"] = str(data["task_id"])
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        if nemo_gym and field == "prompt":
            field = "responses_create_params.input"
        message = first["msg"].removeprefix("Value error, ")  # our validators' own text
        raise fail(field, f"{message} (got {short(first.get('input'))})") from None
    _resolve_images(task, base_dir, fail)
    return task


def _resolve_images(task: Task, base_dir: Path | None, fail: Fail) -> None:
    """Read the image files a task's prompt names into data URLs, in place."""
    for i, message in enumerate(task.prompt):
        for j, part in enumerate(message.parts or []):
            if part.type != "image" or part.url is None:
                continue
            if is_data_url(part.url) or is_remote_url(part.url):
                continue
            try:
                part.url = resolve_image_url(part.url, base_dir)
            except ImageError as exc:
                raise fail(f"prompt[{i}].content[{j}]", str(exc)) from None


def numbered_task_id(row: dict[str, Any], line: int, shard: str | None = None) -> str:
    """The id of a NeMo Gym row without one: its content's digest, then its line.

    NeMo Gym numbers every row it reads (``_ng_task_index``), so two identical lines are two
    tasks; the digest keeps the id tied to the row, so a resumed run over an edited file
    does not take another row's episodes for this one's. In a shard set (``shard``: the
    shard's path within the set) the shard is part of the digest, as two shards have lines
    of the same number.
    """
    content = stable_task_id(row if shard is None else {"row": row, "shard": shard})
    return f"{content}-{line}"


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


_CLAIM = np.dtype([("where", "<u8"), ("content", "<u4")])
_LINE_BITS = 40  # a claim's ``where``: the source's number above, the line below


class UniqueTaskIds:
    """Refuses a ``task_id`` already taken by an earlier row of the same task set.

    Two rows with one id would both run and write the same ``(task_id, sample_index)``
    keys, and ``--resume`` would count either as the other. A repeat with different content
    is an error naming both lines. An exact copy of a row of rayrollout's own format is an
    error too (not silently dropped: a copy usually means a file was concatenated twice,
    and more samples of a task are ``--num-repeats``). An exact copy of a NeMo Gym row
    (``check(..., copies=True)``) is another task, as NeMo Gym plays every line it reads
    (``multichallenge``'s dataset repeats a line byte for byte): the k-th copy of id ``X``
    becomes ``X#k`` (``copy_task_id``), the same id every time the file is read in the
    same order, so ``--resume`` finds what it wrote. Only valid rows claim an id, so a
    rejected row never blocks a later one.

    Memory stays flat in the number of rows: an id is kept as a 12-byte digest with where
    it was met (source and line, 8 bytes) and a 4-byte digest of its task's content (which
    tells a copy from a clash), 24 bytes a task in a ``DigestTable``, never the id itself;
    an id that has copies adds its digest and a count. Sources (files, shards) are
    numbered once each.
    """

    def __init__(self) -> None:
        self._claims = DigestTable(_CLAIM)
        self._sources: dict[str, int] = {}
        self._names: list[str] = []
        self._copies: dict[bytes, int] = {}  # id digest -> copies of it met so far

    def __len__(self) -> int:
        return len(self._claims)

    @property
    def nbytes(self) -> int:
        """Bytes of the digests held (the sorted runs; the buffer adds up to about 2 MB)."""
        return self._claims.nbytes

    def check(self, task: Task, source: str, line: int, *, copies: bool = False) -> Task:
        """Claim ``task``'s id for ``line`` of ``source``, or raise ``InvalidTaskError``
        naming the row that claimed it first. Returns the task; with ``copies`` (a NeMo Gym
        row), an exact copy of an earlier row comes back as another task, its id that of
        its copy index (``copy_task_id``)."""
        number = self._sources.setdefault(source, len(self._sources))
        if number == len(self._names):
            self._names.append(source)
        where = (number << _LINE_BITS) | line
        content = _content(task)
        first_where, first_content = self._claims.setdefault(
            task.task_id.encode(), (where, content)
        )
        if first_where == where:
            return task
        there = self._there(first_where, source)
        if first_content != content:
            message = (
                f"task_id {task.task_id!r} is also on {there}, with different "
                "content; task ids must be unique: give one of the two rows another task_id"
            )
        elif not copies:
            message = (
                f"task_id {task.task_id!r} repeats {there} exactly; remove the copy "
                "(more samples of one task: --num-repeats)"
            )
        else:
            return self._copy(task, source, line, where, there)
        raise InvalidTaskError(source, line, "task_id", message)

    def _copy(self, task: Task, source: str, line: int, where: int, there: str) -> Task:
        """The exact copy of the row on ``there`` as a task of its own, its id claimed."""
        key = digest(task.task_id.encode())
        index = self._copies.get(key, 0) + 1
        self._copies[key] = index
        copy_id = copy_task_id(task.task_id, index)
        if len(copy_id) > MAX_ID_LENGTH:
            raise InvalidTaskError(
                source,
                line,
                "task_id",
                f"repeats {there} exactly, and its copy's id {short(copy_id)} would be over "
                f"{MAX_ID_LENGTH} characters: give the row a shorter task_id",
            )
        copy = task.model_copy(update={"task_id": copy_id})
        first_where, _ = self._claims.setdefault(copy_id.encode(), (where, _content(copy)))
        if first_where != where:
            raise InvalidTaskError(
                source,
                line,
                "task_id",
                f"task_id {task.task_id!r} repeats {there} exactly, and {copy_id!r}, the id "
                f"of copy {index}, is taken by {self._there(first_where, source)}: give one "
                "of these rows another task_id",
            )
        return copy

    def _there(self, first_where: int, source: str) -> str:
        """Where a claim was made, as an error names it ("line 3", "line 3 of a.jsonl")."""
        first_source = self._names[first_where >> _LINE_BITS]
        first_line = first_where & ((1 << _LINE_BITS) - 1)
        return f"line {first_line}" + ("" if first_source == source else f" of {first_source}")


def _content(task: Task) -> int:
    """A 4-byte digest of a task's content, which tells an exact copy from a clash."""
    return int.from_bytes(digest(task.model_dump_json().encode())[:4], "little")


def copy_task_id(task_id: str, index: int) -> str:
    """The id of the ``index``-th exact copy (1, 2, ...) of a NeMo Gym row whose id is
    ``task_id``: ``"<task_id>#<index>"``; the first occurrence keeps ``task_id``."""
    return f"{task_id}#{index}"


def check_rows(
    rows: Iterable[SourceRow],
    *,
    default_environment: str | None = None,
    check_environment: Callable[[str], bool] | None = None,
    unique: UniqueTaskIds | None = None,
    shards: bool = False,
    base_dir: Path | None = None,
) -> Iterator[CheckedRow]:
    """Each row read, checked: ``(source, line, task or the error, raw text)``.

    Args:
        rows: Rows as read (``SourceRow``), from one file or many shards.
        default_environment: Environment for rows that name none (``--env``).
        check_environment: Returns whether an environment name is known; unknown ones are
            errors of field 'environment', as are the ones it raises ``RowRefused`` for.
        unique: The ids claimed so far (a fresh ``UniqueTaskIds`` if None); pass one to
            share it across calls.
        shards: The rows come from a shard set: a NeMo Gym row without an id is numbered
            by its shard and line (``numbered_task_id``).
        base_dir: The folder that image paths in prompts are relative to (the task file's);
            None: a relative image path is a row error.

    Errors are yielded, not raised, so a caller decides (stop, or ``--skip-invalid``). It is
    ``parse_rows``, then each task's environment verdict and ``claim_row``: a caller that
    judges environments itself makes the same three steps.
    """
    unique = UniqueTaskIds() if unique is None else unique
    parsed = parse_rows(
        rows, default_environment=default_environment, shards=shards, base_dir=base_dir
    )
    for source, line, task, raw in parsed:
        if not isinstance(task, InvalidTaskError):
            verdict: bool | str = True
            if check_environment is not None:
                try:
                    verdict = bool(check_environment(task.environment))
                except RowRefused as refused:
                    verdict = str(refused)
            task = claim_row(unique, source, line, task, verdict)
        yield source, line, task, raw


def parse_rows(
    rows: Iterable[SourceRow],
    *,
    default_environment: str | None = None,
    shards: bool = False,
    base_dir: Path | None = None,
) -> Iterator[CheckedRow]:
    """Each row read, parsed into a ``Task`` (or the error), its environment not yet judged
    and its id not yet claimed (``claim_row``); the arguments are ``check_rows``'."""
    for source, line, row, raw in rows:
        if isinstance(row, (InvalidTaskError, Task)):
            yield source, line, row, raw
            continue
        try:
            task = parse_task_row(
                row,
                default_environment=default_environment,
                source=source,
                line=line,
                shard=source if shards else None,
                base_dir=base_dir,
            )
        except InvalidTaskError as exc:
            yield source, line, exc, raw
            continue
        yield source, line, task, raw


def claim_row(
    unique: UniqueTaskIds, source: str, line: int, task: Task, verdict: bool | str
) -> Task | InvalidTaskError:
    """A parsed task once its environment is judged (``verdict``: True known, False unknown,
    or why it is refused), its id claimed in ``unique``; else the row's error. A row refused
    for its environment claims no id."""
    if verdict is not True:
        message = (
            verdict
            if isinstance(verdict, str)
            else f"unknown environment {task.environment!r} (see `rayrollout env list`)"
        )
        return InvalidTaskError(source, line, "environment", message)
    try:
        return unique.check(task, source, line, copies=is_nemo_gym_task(task))
    except InvalidTaskError as exc:
        return exc


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
            errors of field 'environment', as are the ones it raises ``RowRefused`` for.
        on_invalid: Called with each bad row's error (and raw text) instead of raising; the
            rest of the file still streams (``--skip-invalid``).

    A row nested deeper than ``MAX_DEPTH``, a line over ``MAX_ROW_BYTES`` and a ``task_id``
    an earlier row took (``UniqueTaskIds``) are row errors like any other. Memory stays flat
    however long the file: rows are read one at a time, and ids kept as digests.
    """
    source = Path(path).name
    read = ((source, line, row, raw) for line, row, raw in iter_task_rows(path))
    checked = check_rows(
        read,
        default_environment=default_environment,
        check_environment=check_environment,
        base_dir=Path(path).parent,
    )
    for _, _, task, raw in checked:
        if isinstance(task, InvalidTaskError):
            if on_invalid is None:
                raise task
            on_invalid(task, raw)
            continue
        yield task
