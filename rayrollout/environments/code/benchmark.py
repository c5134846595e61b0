"""Measure what the sandbox costs per run: bubblewrap against the plain subprocess it replaced.

Run ``python -m rayrollout.environments.code.benchmark`` (as root, with bwrap installed); the
numbers in ``sandbox.py``'s docstring came from it.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._bootstrap import BOOTSTRAP
from .sandbox import run_sandboxed

__all__ = ["sandbox_overhead"]


async def sandbox_overhead(runs: int = 50, code: str = "print(1)\n") -> dict[str, float]:
    """Median wall-clock milliseconds of one run of ``code``: in the sandbox, and as the plain
    ``unshare --net`` subprocess with the audit hook that came before it."""
    sandboxed, plain = [], []
    with tempfile.TemporaryDirectory() as workdir:
        (Path(workdir) / "main.py").write_text(code)
        command = ["unshare", "--net", "--", sys.executable, "-I", "-B", "-c", BOOTSTRAP]
        for _ in range(runs):
            started = time.perf_counter()
            await run_sandboxed(code)
            sandboxed.append(time.perf_counter() - started)
            started = time.perf_counter()
            subprocess.run(command, cwd=workdir, env={}, capture_output=True, check=True)
            plain.append(time.perf_counter() - started)
    bwrap_ms, plain_ms = statistics.median(sandboxed) * 1e3, statistics.median(plain) * 1e3
    return {"bwrap_ms": bwrap_ms, "plain_ms": plain_ms, "overhead_ms": bwrap_ms - plain_ms}


if __name__ == "__main__":
    print(asyncio.run(sandbox_overhead()))
