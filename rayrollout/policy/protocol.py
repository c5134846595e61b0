"""``Policy``: what the episode loop needs of a policy, as a protocol.

The episode loop (``rayrollout.engine.episode_frame``) calls ``complete`` once per turn and reads
the model name from ``config``; nothing else. ``PolicyClient`` satisfies it (with or
without the worker's ``PolicyGate``), and so does any stand-in a test or a benchmark hands
the loop (a policy that always fails, a canned one), without subclassing the client.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rayrollout.data.config import PolicyConfig
from rayrollout.policy.call import PolicyReply, PolicyRequest

__all__ = ["Policy"]


@runtime_checkable
class Policy(Protocol):
    """A policy the episode loop can play: one model call per turn.

    Errors: ``complete`` raises ``PolicyTimeout`` or ``PolicyError``
    (``rayrollout.policy.client``) when the call fails for good; the episode records them.
    """

    config: PolicyConfig

    async def complete(self, request: PolicyRequest) -> PolicyReply:
        """One model call: the assistant message and the turn's record."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
