"""The demo's task file: the example tasks shipped with every built-in environment."""

from __future__ import annotations

import importlib
from pathlib import Path

from rayrollout.environment.registry import available_environments

__all__ = ["demo_tasks_file"]


def demo_tasks_file(path: Path) -> Path:
    """Write every registered environment's ``tasks.jsonl`` into one file; return its path."""
    lines: list[str] = []
    for _name, target in sorted(available_environments().items()):
        package = importlib.import_module(target.partition(":")[0].rpartition(".")[0])
        example = Path(package.__file__ or "").parent / "tasks.jsonl"
        if example.exists():
            lines += [line for line in example.read_text().splitlines() if line.strip()]
    if not lines:
        raise FileNotFoundError("no environment ships example tasks (tasks.jsonl)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
