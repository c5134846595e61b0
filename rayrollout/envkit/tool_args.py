"""The one checker of a model's tool call, for every hosting: the tool's name and its arguments.

A model that names a tool that does not exist, or sends arguments that are not a JSON
object (or do not fit the tool's schema), has made a mistake it can read and fix: the
episode goes on with an error result. Inline and Serve environments (``contract``), NeMo
Gym servers reached by URL (``nemo_gym.client``) and our own HTTP routes
(``nemo_gym.routes``) all check with these functions, so the model reads the same words
wherever the environment runs.

Example:
    >>> try:
    ...     parse_arguments("add", "[1, 2]")
    ... except ToolCallRejected as exc:
    ...     print(exc)
    Error: arguments of 'add' must be a JSON object, got '[1, 2]'
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from rayrollout.envkit.errors import ToolCallRejected

__all__ = ["ToolCallRejected", "parse_arguments", "unknown_tool"]


def unknown_tool(name: str, known: Iterable[str]) -> ToolCallRejected:
    """The rejection of a call to a tool the environment does not have, listing its tools."""
    listed = ", ".join(sorted(known)) or "none"
    return ToolCallRejected(f"Error: unknown tool '{name}'. Available tools: {listed}.")


def parse_arguments(
    name: str, arguments: str, model: type[BaseModel] | None = None
) -> dict[str, Any]:
    """A tool call's JSON arguments as keyword arguments; raises ``ToolCallRejected``.

    Empty text means no arguments. With ``model`` (the tool's argument model) they are
    validated against it and come back as its field values (nested models stay models);
    without (a remote server that validates them itself) the JSON object comes back as is.
    """
    try:
        raw = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolCallRejected(
            f"Error: arguments of '{name}' are not valid JSON ({exc.msg} at "
            f"position {exc.pos}): {arguments[:200]!r}"
        ) from None
    except RecursionError:
        raise ToolCallRejected(
            f"Error: arguments of '{name}' are nested too deeply to read: {arguments[:200]!r}"
        ) from None
    if not isinstance(raw, dict):
        raise ToolCallRejected(
            f"Error: arguments of '{name}' must be a JSON object, got {arguments[:200]!r}"
        )
    if model is None:
        return raw
    try:
        return dict(model.model_validate(raw))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        raise ToolCallRejected(f"Error: invalid arguments for '{name}': {problems}") from None
