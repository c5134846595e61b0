"""The demo's task file: the example tasks of every built-in environment this machine can run.

An environment that says it cannot run here (``Environment.unavailable_reason``: the code
sandbox without bubblewrap) is left out, and the command prints why, so that the demo a
newcomer runs after ``pip install`` alone ends with every episode ``ok`` instead of a
failed row per episode of that environment.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from rayrollout.environment.registry import available_environments

if TYPE_CHECKING:
    from rayrollout.data.config import RunConfig

__all__ = ["write_demo_tasks"]


def write_demo_tasks(path: Path, config: RunConfig) -> dict[str, str]:
    """Write the ``tasks.jsonl`` of every registered environment this machine can run into
    one file at ``path``; return the environments left out, each with its reason (a line
    naming the fix).

    Raises:
        FileNotFoundError: no environment that can run here ships example tasks.
    """
    from rayrollout.api.preflight import environment_unavailable

    lines: list[str] = []
    left_out: dict[str, str] = {}
    for name, target in sorted(available_environments().items()):
        package = importlib.import_module(target.partition(":")[0].rpartition(".")[0])
        example = Path(package.__file__ or "").parent / "tasks.jsonl"
        if not example.exists():
            continue
        reason = environment_unavailable(name, config)
        if reason is not None:
            left_out[name] = reason
            continue
        lines += [line for line in example.read_text().splitlines() if line.strip()]
    if not lines:
        raise FileNotFoundError(
            "no environment this machine can run ships example tasks (tasks.jsonl)"
            + "".join(f"; {name}: {reason}" for name, reason in left_out.items())
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return left_out
