"""Adapters that make rayrollout the rollout of a trainer a team already runs (SkyRL, TRL,
verl, OpenRLHF).

Each trainer keeps its own Python, Ray and pins, so each adapter reaches the engine through
the light HTTP client (``rayrollout.client``) and turns the rows it streams into the trainer's
own batch type. ``sequences`` holds what every adapter shares: one trajectory as one token
sequence (prompt ids, response ids, a mask that is 1 exactly on policy tokens, logprobs
aligned with it, the policy version of every turn, the failure if there was one). The
trainer modules (``skyrl``, ``trl``, ``verl``, ``openrlhf``) import their trainer lazily:
importing one without the trainer installed raises an ``ImportError`` naming the install.

May import: ``rayrollout.client`` and ``rayrollout.errors``, the standard library, pydantic,
and (inside the trainer modules) the trainer's own packages; nothing else of rayrollout, so
the package runs wherever ``rayrollout-client`` is installed.
"""

from __future__ import annotations

from rayrollout.integrations.sequences import Sequence, flatten, group_rows

__all__ = ["Sequence", "flatten", "group_rows"]
