"""The sandboxed code's own time: wall time less what a busy machine took from it.

A verifier on a loaded node must not score correct code 0 because other programs held the
CPUs. The kernel's ``schedstat`` says how long a thread was ready to run but waited for a
CPU, so the time the code's main thread waited is taken off the wall time. That figure
cannot tell a CPU held by other programs from one held by the code's own other processes
(a fork bomb's main thread waits for its children), so the code's time is never less than
the CPU time all its processes used, spread over the CPUs it may run on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["CodeClock"]

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class CodeClock:
    """The code's own time since the clock was made (when the code starts), for the sandbox
    whose init has host pid ``init_pid`` (None: plain wall time).

    ``elapsed`` is the larger of the wall time less the time the code's main thread waited
    for a CPU (at most ``wait_limit_s`` of it) and the sandbox's CPU time over its CPUs.
    """

    def __init__(self, init_pid: int | None, wait_limit_s: float) -> None:
        self._init = init_pid
        self._wait_limit_s = wait_limit_s
        self._cores = len(os.sched_getaffinity(0))  # the sandbox inherits this process's
        self._main = _first_child(init_pid) if init_pid is not None else None
        self._started = time.monotonic()
        self._waited_before = self._main_waited_s()
        self._cpu_before = self._sandbox_cpu_s()

    def elapsed(self) -> float:
        """Seconds of the code's own time so far."""
        wall = time.monotonic() - self._started
        waited = min(max(self._main_waited_s() - self._waited_before, 0.0), self._wait_limit_s)
        cpu = (self._sandbox_cpu_s() - self._cpu_before) / self._cores
        return max(wall - waited, cpu)

    def _main_waited_s(self) -> float:
        """Seconds the main thread has waited for a CPU (``schedstat``'s second field); 0
        where the kernel does not keep it or the thread has ended."""
        if self._main is None:
            return 0.0
        try:
            stat = Path(f"/proc/{self._main}/task/{self._main}/schedstat").read_text()
            return int(stat.split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def _sandbox_cpu_s(self) -> float:
        """CPU seconds used by the live processes from the init down, and by the children
        they have reaped."""
        ticks = 0
        pending = [] if self._init is None else [self._init]
        while pending:
            pid = pending.pop()
            try:
                # pid (comm) state ...: comm may hold spaces, so split after its ')'
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += sum(int(field) for field in fields[11:15])  # utime stime cutime cstime
                pending += _children(pid)
            except (OSError, ValueError, IndexError):
                continue
        return ticks / _TICKS_PER_S


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid``."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            found += [
                int(child) for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            ]
        except (OSError, ValueError):
            continue
    return found


def _first_child(pid: int) -> int | None:
    """The init's one child: the bootstrap's interpreter, which runs the code."""
    children = _children(pid)
    return children[0] if children else None
