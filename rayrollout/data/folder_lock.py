"""The output folder's one-writer lock, and the note in it saying who holds it.

Two writers would write every sample twice, so the writer ``flock``s ``.lock`` and notes its
pid, driver pid and host (``LockHolder``): a held lock whose driver is alive is a second run,
refused; one whose driver is gone is a killed run's orphan, waited for.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

__all__ = ["LockHolder", "acquire"]


def acquire(
    path: Path, driver_pid: int | None, timeout_s: float, unknown_wait_s: float
) -> tuple[IO[str] | None, LockHolder | None]:
    """Take the lock at ``path`` for this process, serving ``driver_pid``'s run.

    Returns ``(the open, locked file, None)``, or ``(None, the holder)`` when refused: at once
    if the holder's driver is alive, after ``timeout_s`` if it is gone (a killed run's
    orphan), after ``unknown_wait_s`` if that cannot be told (another host, no note).
    """
    lock = path.open("a+")
    started = time.monotonic()
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = LockHolder.read(path)
            alive = holder.driver_alive() if holder is not None else None
            limit = timeout_s if alive is False else unknown_wait_s
            if alive or time.monotonic() - started >= limit:
                lock.close()
                return None, holder
            time.sleep(0.2)
            continue
        LockHolder.mine(driver_pid).write(lock)
        return lock, None


@dataclass
class LockHolder:
    """Who holds a folder's lock, as noted in the lock file: the writing process, the run's
    driver (which may be the writer itself), and the host they run on."""

    pid: int
    driver_pid: int
    host: str

    @classmethod
    def mine(cls, driver_pid: int | None) -> LockHolder:
        """This process as the holder, serving ``driver_pid``'s run (else its own)."""
        return cls(os.getpid(), driver_pid or os.getpid(), socket.gethostname())

    @classmethod
    def read(cls, path: Path) -> LockHolder | None:
        """The note in a lock file; None if absent or unreadable (an older writer's)."""
        try:
            note = json.loads(path.read_text(encoding="utf-8"))
            return cls(int(note["pid"]), int(note["driver_pid"]), str(note["host"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, lock: IO[str]) -> None:
        """Replace the lock file's note with this one (the lock is held, so none races)."""
        lock.seek(0)
        lock.truncate()
        lock.write(json.dumps(asdict(self)) + "\n")
        lock.flush()

    def driver_alive(self) -> bool | None:
        """Whether the run's driver still runs; None when it cannot be told (another host)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.driver_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, another user's
            return True
        return True

    def describe(self) -> str:
        """The holder as an error message names it."""
        started = "" if self.driver_pid == self.pid else f", started by pid {self.driver_pid}"
        return f"the writer pid {self.pid}{started} on {self.host}"
