"""``python -m rayrollout``: the ``rayrollout`` command, run by a Python instead of its script.

It serves a venv whose ``bin/`` holds no ``rayrollout`` script of its own: one that reaches
rayrollout's install through a ``.pth`` file (verifiers' venv in
docs/how-to/environment-sources.md), or a shell whose PATH lacks the venv's ``bin/``. It is
the top of the import graph: nothing imports it.
"""

from rayrollout.cli.commands import main

if __name__ == "__main__":
    main()
