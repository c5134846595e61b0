"""Per-episode environment state on a Serve replica, released when a session goes idle.

Not every client closes (a NeMo Gym agent may stop mid-episode, a killed worker retries under
new ids), so a session with no call for ``idle_timeout_s`` is closed here, as on a normal
end; one with a call in flight never expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from rayrollout.envkit import Environment
from rayrollout.envkit.errors import SessionNotOpen

__all__ = ["SessionNotOpen", "SessionStore"]

logger = logging.getLogger(__name__)

_EXPIRED_REMEMBERED = 10_000  # expired ids kept to say "expired" rather than "unknown"


class SessionStore:
    """Open environments by episode id, with idle expiry (the sweep starts at first open)."""

    def __init__(self, env_name: str, idle_timeout_s: float) -> None:
        self.env_name = env_name
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[str, Environment] = {}
        self.last_used: dict[str, float] = {}  # monotonic time of the last call's end
        self.busy: Counter[str] = Counter()  # calls in flight per session
        self.expired: OrderedDict[str, None] = OrderedDict()
        self.expired_count = 0
        self.sweeper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.sessions)

    async def open(self, episode_id: str, env: Environment) -> None:
        """Hold ``env`` (already set up) as the episode's state; a re-seeded id starts over."""
        await self.close(episode_id)
        self.sessions[episode_id] = env
        self.last_used[episode_id] = time.monotonic()
        self.expired.pop(episode_id, None)
        if self.sweeper is None or self.sweeper.done():
            self.sweeper = asyncio.get_running_loop().create_task(self._sweep())

    @contextmanager
    def use(self, episode_id: str) -> Iterator[Environment]:
        """The episode's environment, kept from expiry while the ``with`` block runs.

        Raises:
            SessionNotOpen: no state for ``episode_id`` on this replica.
        """
        env = self.sessions.get(episode_id)
        if env is None:
            if episode_id in self.expired:
                why = f"it expired after {self.idle_timeout_s:g} s without a call"
            else:
                why = "the replica restarted, or the call was routed without its session id"
            raise SessionNotOpen(
                f"episode {episode_id} has no open session on this '{self.env_name}' replica "
                f"({why})"
            )
        self.busy[episode_id] += 1
        try:
            yield env
        finally:
            self.busy[episode_id] -= 1
            if self.busy[episode_id] <= 0:
                del self.busy[episode_id]
            if episode_id in self.sessions:
                self.last_used[episode_id] = time.monotonic()

    async def close(self, episode_id: str) -> None:
        """Release the episode's state (a no-op for an unknown or closed id)."""
        env = self.sessions.pop(episode_id, None)
        self.last_used.pop(episode_id, None)
        if env is not None:
            await env.close()

    async def expire_idle(self) -> int:
        """Close every session idle past the timeout with no call in flight; returns how many."""
        deadline = time.monotonic() - self.idle_timeout_s
        idle = [
            key for key, used in self.last_used.items() if used < deadline and not self.busy[key]
        ]
        for key in idle:
            try:
                await self.close(key)
            except Exception:  # the state is dropped either way; say why it did not close
                logger.exception("closing idle session %s of '%s' failed", key, self.env_name)
            self.expired[key] = None
            if len(self.expired) > _EXPIRED_REMEMBERED:
                self.expired.popitem(last=False)
        self.expired_count += len(idle)
        return len(idle)

    async def _sweep(self) -> None:
        interval = min(60.0, max(0.05, self.idle_timeout_s / 4))
        while self.sessions:
            await asyncio.sleep(interval)
            await self.expire_idle()
