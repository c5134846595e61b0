"""What every command shares: the console, one-line errors with their exit code, and the
flags-to-config overrides.

Errors reach the terminal one way: a command raises (a ``RayrolloutError`` from the API, or
calls ``fail`` for a flag it refuses itself), and the user reads ``error: <message>`` with
exit code 2 for bad input, 1 otherwise. Never a traceback for something the user can fix.
"""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from rayrollout.errors import RayrolloutError, exit_code

__all__ = ["console", "fail", "fail_with", "overrides"]

console = Console(stderr=True)
"""Messages, progress and errors go to stderr; stdout keeps what a command prints as data."""


def fail(message: str, code: int) -> NoReturn:
    """Print ``error: <message>`` and end the command with exit code ``code``.

    Printed without wrapping (``soft_wrap``) so the message stays one line (a message that
    lists rows, like the invalid rows of a tasks file, keeps its own line breaks).
    """
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def fail_with(error: RayrolloutError) -> NoReturn:
    """``fail`` for a rayrollout error: exit 2 for an ``InputError``, 1 for the rest. An error
    raised inside an actor arrives wrapped by Ray (its ``cause``, with the actor's traceback
    in its text): the message is the cause's own."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, RayrolloutError):
        error = cause
    fail(str(error), exit_code(error))


def overrides(**flags: Any) -> dict[str, Any]:
    """CLI flags as a nested config override (``output__dir`` -> ``{"output": {"dir"}}``),
    leaving out flags not given."""
    out: dict[str, Any] = {}
    for dotted, value in flags.items():
        if value is None or value is False:
            continue
        node = out
        *parents, leaf = dotted.split("__")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out


def config_option(key: str, default: str, *names: str, help: str) -> Any:
    """A flag that overrides the --config file's ``key``: --help shows both defaults (spelled
    out, so that --help loads no config)."""
    return typer.Option(*names, help=help, show_default=f"--config's {key}, else {default}")
