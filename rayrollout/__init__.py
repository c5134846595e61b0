"""rayrollout: a rollout engine for reinforcement learning of LLM agents, built on Ray.

Tasks go in, scored multi-turn trajectories come out, streamed to Parquet or JSONL.

The public names, by what they are for (the rest lives in the subpackages; a test holds
``__all__`` to this list):

- ``RolloutEngine``, ``CollectResult``, ``read_trajectories``: collect rollouts from Python
  and read an output folder back.
- ``RunConfig``, ``load_config``: the run's config, from a dict or a YAML file.
- ``Task``, ``Trajectory``, ``Message``, ``trajectory_arrow_schema``: the rows in and out.
- ``read_tasks``, ``InvalidTaskError``: stream a task file; the error naming a bad row.
- ``Environment``, ``tool``, ``ToolResult``, ``ToolError``, ``Episode``, ``Verification``:
  write an environment.
- ``RayrolloutError``: the base of every error rayrollout raises (``rayrollout.errors`` has
  one base per boundary: input, policy, environment, output, cluster).

Importing ``rayrollout`` is light: each name loads its module on first use (``__getattr__``),
so ``rayrollout --help`` and a script that only reads a folder back never pay for Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayrollout.api.rollout_engine import CollectResult, RolloutEngine, read_trajectories
    from rayrollout.data.config import RunConfig, load_config
    from rayrollout.data.schema import Message, Task, Trajectory, trajectory_arrow_schema
    from rayrollout.data.tasks import InvalidTaskError, read_tasks
    from rayrollout.environment import (
        Environment,
        Episode,
        ToolError,
        ToolResult,
        Verification,
        tool,
    )
    from rayrollout.errors import RayrolloutError

# Each public name -> the module defining it, imported when the name is first asked for.
_HOMES = {
    "CollectResult": "rayrollout.api.rollout_engine",
    "RolloutEngine": "rayrollout.api.rollout_engine",
    "read_trajectories": "rayrollout.api.rollout_engine",
    "RunConfig": "rayrollout.data.config",
    "load_config": "rayrollout.data.config",
    "Message": "rayrollout.data.schema",
    "Task": "rayrollout.data.schema",
    "Trajectory": "rayrollout.data.schema",
    "trajectory_arrow_schema": "rayrollout.data.schema",
    "InvalidTaskError": "rayrollout.data.tasks",
    "read_tasks": "rayrollout.data.tasks",
    "Environment": "rayrollout.environment",
    "Episode": "rayrollout.environment",
    "ToolError": "rayrollout.environment",
    "ToolResult": "rayrollout.environment",
    "Verification": "rayrollout.environment",
    "tool": "rayrollout.environment",
    "RayrolloutError": "rayrollout.errors",
}

__all__ = [
    "CollectResult",
    "Environment",
    "Episode",
    "InvalidTaskError",
    "Message",
    "RayrolloutError",
    "RolloutEngine",
    "RunConfig",
    "Task",
    "ToolError",
    "ToolResult",
    "Trajectory",
    "Verification",
    "load_config",
    "trajectory_arrow_schema",
    "read_tasks",
    "read_trajectories",
    "tool",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for (then kept)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rayrollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
