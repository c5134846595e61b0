"""What a request carries, read before anything else touches it: the JSON body, bounded in
depth, and the stream's ``cursor`` query.

A body nested deeper than a task row may be (``MAX_DEPTH``) is a 400 naming where, before
any validator recurses into it; a cursor is ASCII digits up to ``MAX_CURSOR``.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from rayrollout.api.service.engine_link import HttpError
from rayrollout.data.tasks import MAX_DEPTH

__all__ = ["MAX_BODY_DEPTH", "MAX_CURSOR", "parse_body", "parse_cursor", "too_deep"]

MAX_BODY_DEPTH = MAX_DEPTH + 2
"""Levels of objects and lists a body may nest: a task row's bound, within a submit's body
(the body, then its ``tasks`` list, then the row)."""
MAX_CURSOR = 2**63 - 1
"""The largest cursor a stream takes (no batch holds this many rows)."""
_DIGITS = re.compile(r"[0-9]{1,19}")
_SHOWN = 40  # characters of an offending value quoted back


def too_deep(value: Any, limit: int = MAX_BODY_DEPTH) -> str | None:
    """Where ``value`` nests deeper than ``limit`` levels (a dotted path), else None.

    Walks with a stack of its own, never recursing, and stops at the first container past
    the limit, so a hostile body costs no more than a fair one.
    """
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, path = stack.pop()
        if depth > limit:
            return path or "(the body)"
        named = isinstance(item, dict)
        for key, child in item.items() if named else enumerate(item):
            if isinstance(child, dict | list):
                where = (f"{path}.{key}" if path else str(key)) if named else f"{path}[{key}]"
                stack.append((child, depth + 1, where))
    return None


def parse_body(raw: bytes) -> Any:
    """The request body as JSON (an empty body is ``{}``).

    Raises:
        HttpError: 400 for a body that is not JSON or nests too deeply, naming where.
    """
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"the request body is not JSON: {exc}") from None
    if isinstance(body, dict | list):
        where = too_deep(body)
        if where is not None:
            shown = where if len(where) <= 2 * _SHOWN else f"{where[:_SHOWN]}...{where[-_SHOWN:]}"
            raise HttpError(
                400,
                f"field '{shown}': the body nests deeper than {MAX_BODY_DEPTH} levels of "
                f"objects and lists (a task row at most {MAX_DEPTH}); flatten it, or move the "
                "deep value into a JSON string field. Nothing was started",
                field=where,
            )
    return body


def parse_cursor(raw: str) -> int:
    """The ``cursor`` query of a stream: a non-negative integer up to ``MAX_CURSOR``.

    Raises:
        HttpError: 400 naming the query and the value.
    """
    if _DIGITS.fullmatch(raw) is None or int(raw) > MAX_CURSOR:
        shown = raw if len(raw) <= _SHOWN else f"{raw[:_SHOWN]}... ({len(raw)} characters)"
        raise HttpError(
            400,
            f"query 'cursor': a non-negative integer of at most {MAX_CURSOR} (the cursor "
            f"after the last row read), got {shown!r}",
            field="cursor",
        )
    return int(raw)
