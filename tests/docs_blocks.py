"""The fenced code blocks of a docs page, as the docs tests read, save and run them.

A block is what a reader copies: ```` ```bash ````, ```` ```python ````, ```` ```yaml ````
and so on, with an optional title (```` ```json title="tasks.jsonl" ````: a file the reader
saves under that name). An HTML comment on the line before a block,
``<!-- docs-test: skip (why) -->``, says that the tests do not run it, and why (an install
step, a command that needs a GPU, a model server or a trainer's own venv). The reason is
part of the marker: a skip without one is refused, so a page says why each of its commands
goes unchecked. ``<!-- docs-test: requires MODULE -->`` runs a block only where the Python
module ``MODULE`` is installed (an optional extra such as ``openenv``), and skips it
otherwise, naming the module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
SKIP = "<!-- docs-test: skip"
SKIP_REASON = re.compile(r"<!-- docs-test: skip \((.+)\) -->")
REQUIRES = re.compile(r"<!-- docs-test: requires ([\w.]+) -->")


@dataclass
class Block:
    """One fenced code block of a page: its language, its title (a file name) if any, its
    code, whether a skip marker precedes it and why, and its line in the page."""

    language: str
    title: str | None
    code: str
    skipped: bool
    line: int
    skip_reason: str | None = None
    requires: str | None = None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, at the top level or indented under a list item, in
    page order."""
    text = _dedented_fences(path.read_text(encoding="utf-8"))
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        title = re.search(r'title="([^"]+)"', match.group(2))
        reason = SKIP_REASON.fullmatch(before)
        requires = REQUIRES.fullmatch(before)
        found.append(
            Block(
                language=match.group(1),
                title=title.group(1) if title else None,
                code=match.group(3),
                skipped=before.startswith(SKIP),
                line=text[: match.start()].count("\n") + 1,
                skip_reason=reason.group(1).strip() if reason else None,
                requires=requires.group(1) if requires else None,
            )
        )
    return found


def _dedented_fences(text: str) -> str:
    """``text`` with each fence indented under a list item moved to column 0 and its code
    dedented by the fence's indent. Every line keeps its number."""
    out: list[str] = []
    indent: int | None = None
    for line in text.split("\n"):
        stripped = line.lstrip(" ")
        if stripped.startswith("```"):
            if indent is None:
                indent = len(line) - len(stripped)
            elif stripped.strip() == "```":
                indent = None
            out.append(stripped)
            continue
        if indent:
            line = line[min(indent, len(line) - len(stripped)) :]
        out.append(line)
    return "\n".join(out)


def reader_environment() -> dict[str, str]:
    """A shell as the reader's, after the install step: this venv's scripts first on PATH,
    no cluster to join, nothing extra on Python's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def save_block(block: Block, folder: Path) -> Path:
    """Write a titled block where the reader saves it: ``folder / block.title``."""
    assert block.title is not None, "only a block with a title is a file to save"
    target = folder / block.title
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.code, encoding="utf-8")
    return target


def run_block(block: Block, folder: Path, env: dict[str, str], where: str, timeout: float) -> bool:
    """Run a ``bash`` block in bash or a ``python`` block in this Python, in ``folder``, and
    fail naming ``where`` and the output's tail unless it exits 0. False, with nothing run,
    for a block of any other language: the caller says what such a block lacks."""
    if block.language == "bash":
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    elif block.language == "python":
        command = [sys.executable, "-c", block.code]
    else:
        return False
    done = subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (
        f"{where} exited {done.returncode}:\n{block.code}\n"
        f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}"
    )
    return True
