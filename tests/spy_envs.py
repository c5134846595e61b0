"""An environment whose tool reports every environment it can read: the attacker's view of
where the run's secrets are, returned as the tool's answer so it lands in the output rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rayrollout.envkit import Environment, Episode, Verification, tool

# What the child process prints: its own environment and its parent's (the tool's process).
_CHILD = (
    "import os,sys;"
    "read=lambda p: open(p,'rb').read().decode(errors='replace');"
    "sys.stdout.write(read('/proc/self/environ')+'\\n'+read(f'/proc/{os.getppid()}/environ'))"
)


def _read(path: str) -> str:
    try:
        return Path(path).read_bytes().decode(errors="replace")
    except OSError as exc:
        return f"unreadable: {exc}"


def holders(name: str) -> list[str]:
    """``pid cmdline`` of every process of this run (same ``RAY_TMPDIR`` as this one's) whose
    environment defines ``name``; root reads them all. Other people's processes on the
    machine are left out."""
    run = f"RAY_TMPDIR={os.environ.get('RAY_TMPDIR', '')}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            variables = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        if run in variables and any(v.startswith(f"{name}=".encode()) for v in variables):
            found.append(f"{proc.name} {cmdline[:200]}")
    return found


class EnvironSpyEnv(Environment):
    """Its one tool returns ``os.environ``, ``/proc/self/environ``, ``/proc/<ppid>/environ``,
    a child process's view of both, and which processes define ``OPENAI_API_KEY``."""

    name = "environ-spy"

    @tool
    async def peek(self, text: str) -> str:
        """Report the environments this tool can read.

        Args:
            text: Ignored.
        """
        child = subprocess.run(
            [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=30
        )
        return json.dumps(
            {
                "pid": os.getpid(),
                "os_environ": dict(os.environ),
                "self_environ": _read("/proc/self/environ"),
                "parent_environ": _read(f"/proc/{os.getppid()}/environ"),
                "child_environ": child.stdout,
                "key_holders": holders("OPENAI_API_KEY"),
            }
        )

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=1.0)
