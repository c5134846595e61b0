"""Peak memory of a command and of every process under it, sampled from ``/proc``.

``task_scale.py`` runs ``rayrollout collect`` in a subprocess and reads, per role (the
driver, each Ray actor class, Ray's workers and daemons), the largest RSS any of its processes
reached while the command ran.
"""

from __future__ import annotations

import threading
from typing import Any

from rayrollout.cli.env_commands import descendants

SAMPLE_S = 0.2
_FIND_EVERY = 5  # samples between two walks of /proc for new processes under the driver
MB = 2**20


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as file:
            return file.read().decode(errors="replace")
    except OSError:
        return None


def role_of(pid: int, root: int) -> str | None:
    """The command (``driver``), a Ray actor's class (``EngineActor``, from the process
    title ``ray::engine:EngineActor.method``), a Ray worker without an actor (``ray worker``), or
    Ray's own daemons (``ray daemons``); None once the process is gone."""
    if pid == root:
        return "driver"
    command = _read(f"/proc/{pid}/cmdline")
    if command is None:
        return None
    title = command.replace("\0", " ").strip()
    if title.startswith("ray::"):  # ray::[actor name:]Class[.method]
        name = title[5:].split(" ", 1)[0].split(".", 1)[0].rsplit(":", 1)[-1]
        return "ray worker" if name in ("IDLE", "") else name
    return "ray daemons"


_PARTS = {"RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}


def _memory(pid: int) -> dict[str, int] | None:
    """A live process's RSS, its peak (``VmHWM``) and the RSS's parts (anonymous, file-backed:
    code and mapped files, shared memory: Ray's object store), in bytes."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return None
    fields = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", *_PARTS):
            fields[key] = int(value.split()[0]) * 1024
    if "VmRSS" not in fields:
        return None  # a zombie
    return fields


class Watcher(threading.Thread):
    """Samples the memory of a process and of every process under it until ``stop``."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peaks: dict[int, dict[str, Any]] = {}  # pid -> role, peak, the parts' peaks
        self.samples = 0
        self._stopped = threading.Event()

    def run(self) -> None:
        tracked: list[int] = [self.root]
        while not self._stopped.is_set():
            if self.samples % _FIND_EVERY == 0:
                tracked = [self.root, *descendants(self.root)]
            for pid in tracked:
                self._sample(pid)
            self.samples += 1
            self._stopped.wait(SAMPLE_S)

    def _sample(self, pid: int) -> None:
        memory = _memory(pid)
        if memory is None:
            return
        entry = self.peaks.get(pid)
        if entry is None or entry["role"] in ("ray worker", "ray daemons"):
            role = role_of(pid, self.root)  # a worker's title changes once it holds an actor
            if role is None:
                return
            entry = self.peaks.setdefault(pid, {"role": role, "peak": 0})
            entry["role"] = role
        entry["peak"] = max(entry["peak"], memory["VmRSS"], memory.get("VmHWM", 0))
        for key, part in _PARTS.items():
            entry[part] = max(entry.get(part, 0), memory.get(key, 0))

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=5)

    def by_role(self) -> dict[str, dict[str, Any]]:
        """Per role: the largest peak RSS of its processes (MB), the largest sampled peak of
        each part of it (anonymous, file-backed, shared), and how many processes it had."""
        roles: dict[str, dict[str, Any]] = {}
        for entry in self.peaks.values():
            role = roles.setdefault(entry["role"], {"processes": 0, "peak_rss_mb": 0.0})
            role["processes"] += 1
            for name, key in [("peak_rss_mb", "peak")] + [
                (f"peak_{part}_rss_mb", part) for part in _PARTS.values()
            ]:
                role[name] = round(max(role.get(name, 0.0), entry.get(key, 0) / MB), 1)
        return dict(sorted(roles.items(), key=lambda item: -item[1]["peak_rss_mb"]))
