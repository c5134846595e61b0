"""A JSON text read as one object, or ``None``: how a server's answer or a model's reply that
must be a JSON object is read, so each caller only words its own refusal.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["json_object"]


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """``text`` parsed, when it is a JSON object; ``None`` when it is not JSON or not an object.

    Example:
        >>> json_object('{"reward": 1}'), json_object("[1]"), json_object("no")
        ({'reward': 1}, None, None)
    """
    try:
        answer = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return answer if isinstance(answer, dict) else None
