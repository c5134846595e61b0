"""Shared by the sandbox escape tests: the attack harness and its controls.

``script`` builds attack code (by default switching the audit hook off first), ``attack``
runs it in the sandbox and checks the planted key is in no output, ``control`` runs the same
code under the audit hook alone as a plain child of this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from string import Template

from rayrollout.environments.code._bootstrap import BOOTSTRAP
from rayrollout.environments.code.sandbox import RunResult, run_sandboxed

KEY = f"sk-planted-{uuid.uuid4().hex}"
REPO = Path(__file__).resolve().parents[4]

# Switches the audit hook off from inside (and gives subprocess its fork_exec back), then
# defines attempt(): "ESCAPED ..." when the action succeeds, "blocked: ..." when it raises.
UNHOOK = """\
import gc, sys, subprocess
for obj in gc.get_objects():
    if type(obj).__name__ == "function" and obj.__name__ == "hook" and obj.__closure__:
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__):
            replacement = {"inside": lambda path: True, "denied": {}, "write_flags": 0,
                           "changes": ()}
            if name in replacement:
                cell.cell_contents = replacement[name]
del sys.modules["_posixsubprocess"]
import _posixsubprocess
subprocess._posixsubprocess = _posixsubprocess
"""
ATTEMPT = """\
import json, os
def attempt(action, show=False):
    try:
        value = action()
    except BaseException as exc:
        return f"blocked: {type(exc).__name__}: {exc}"
    return "ESCAPED" + (f": {value!r}" if show else "")
"""


def script(code: str, unhook: bool = True, **values: object) -> str:
    body = Template(textwrap.dedent(code)).substitute({k: str(v) for k, v in values.items()})
    return (UNHOOK if unhook else "") + ATTEMPT + body


async def attack(code: str, **limits: float) -> RunResult:
    """Run attack code in the sandbox; no attack may print the planted key."""
    result = await run_sandboxed(code, **limits)  # type: ignore[arg-type]
    assert KEY not in result.stdout + result.stderr
    return result


def control(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """The same code under the audit hook alone: a plain child of this process, as root."""
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "main.py").write_text(code)
    command = [sys.executable, "-I", "-B", "-c", BOOTSTRAP]
    done = subprocess.run(
        command, cwd=cwd, env=env or {"HOME": str(cwd)}, capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found
