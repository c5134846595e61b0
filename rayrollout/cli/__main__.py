"""``python -m rayrollout.cli``: the same as the ``rayrollout`` command."""

import sys

from rayrollout.cli.commands import main

sys.exit(main())
