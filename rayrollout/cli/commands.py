"""The ``rayrollout`` app: every command registered in the order ``--help`` lists them, and
the one place a ``RayrolloutError`` becomes ``error: <message>`` and an exit code.

The commands live by job: ``collect`` (collect, demo), ``cluster_commands`` (up, status,
down), ``output_commands`` (show, report, export), ``env_commands`` (the ``env`` group),
``agent_commands`` (the ``agent`` group).
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from rayrollout.cli.agent_commands import agent_app
from rayrollout.cli.cluster_commands import down, status, up
from rayrollout.cli.collect import collect, demo
from rayrollout.cli.common import fail_with
from rayrollout.cli.env_commands import env_app
from rayrollout.cli.output_commands import export, report, show
from rayrollout.errors import RayrolloutError

__all__ = ["app", "main"]


class _OneLineErrors(TyperGroup):
    """The app's command group: a ``RayrolloutError`` from any command, however deep, ends
    as one line and exit 2 (bad input) or 1, never a traceback. Here rather than in ``main``
    so that ``app`` called in-process (tests, ``typer.testing.CliRunner``) behaves the same."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except RayrolloutError as exc:
            fail_with(exc)


app = typer.Typer(
    cls=_OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    help="rayrollout: scored multi-turn agent rollouts on Ray.",
)
for command in (collect, up, status, down, demo, show, report, export):
    app.command()(command)
app.add_typer(env_app, name="env")
app.add_typer(agent_app, name="agent")


def main() -> None:
    """The ``rayrollout`` console script."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
