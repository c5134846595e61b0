"""Adapters that make rayrollout the rollout of a trainer a team already runs (SkyRL, TRL,
verl, OpenRLHF), over the light HTTP client; each imports its trainer lazily.

May import: ``rayrollout.client`` and ``rayrollout.errors``, the standard library, pydantic,
and (inside the trainer modules) the trainer's own packages; nothing else of rayrollout.
"""

from __future__ import annotations

from rayrollout.integrations.sequences import Sequence, flatten, group_rows

__all__ = ["Sequence", "flatten", "group_rows"]
