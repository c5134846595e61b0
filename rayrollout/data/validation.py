"""A pydantic validation error as the one line rayrollout's errors give: the field, what is
wrong with it, and what was there, worded alike at every boundary.

May import: nothing of rayrollout.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

__all__ = ["first_problem", "problem_text"]


def first_problem(exc: ValidationError) -> tuple[str, str, Any]:
    """(field path, message, input) of the error's first problem; the path dotted
    (``observation.reward``), empty for the value as a whole."""
    problem = exc.errors()[0]
    return ".".join(str(p) for p in problem["loc"]), problem["msg"], problem.get("input")


def problem_text(exc: ValidationError, limit: int = 200) -> str:
    """``'<field>': <message> (got <input>)``, the input's repr cut at ``limit`` characters."""
    field, message, given = first_problem(exc)
    return f"'{field}': {message} (got {repr(given)[:limit]})"
