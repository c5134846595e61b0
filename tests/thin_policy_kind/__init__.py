"""A policy kind written outside rayrollout: one folder and one entry point.

``policy.kind: thin`` answers every model call with its own setting ``policy.reply``, from a
small OpenAI-compatible HTTP server the run starts in the driver and stops when it ends.
``tests/test_policy_kind_plugin.py`` registers it the way ``pip install`` would: a
``dist-info`` folder whose ``entry_points.txt`` names it under ``rayrollout.policies``.
"""

from thin_policy_kind.kind import THIN, ThinSettings

__all__ = ["THIN", "ThinSettings"]
