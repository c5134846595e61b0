"""``python -m rayrollout.cli``: the same as the ``rayrollout`` command."""

from rayrollout.cli.commands import main

main()
