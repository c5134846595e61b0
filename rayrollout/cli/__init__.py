"""The command line (``rayrollout``): a thin typer layer over the API. The app and its
one-line errors (``commands``), the commands by job (``collect``, ``cluster_commands``,
``output_commands``, ``env_commands``, sharing ``common``), the console progress and summary
(``progress``), a collect run on the terminal (``terminal_run``), ``show``, ``report`` and
the demo's tasks (``demo``).

May import: every other part of rayrollout; nothing imports it.
"""

from rayrollout.cli.commands import app, main

__all__ = ["app", "main"]
