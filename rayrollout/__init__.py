"""rayrollout: a rollout engine for reinforcement learning of LLM agents, built on Ray.

Tasks go in, scored multi-turn trajectories come out, streamed to Parquet or JSONL.

The public names, by what they are for (a test holds ``__all__`` to this list and to the
names the docs use):

- ``RolloutEngine``, ``CollectResult``, ``read_trajectories``: collect rollouts from Python
  and read an output folder back.
- ``RunConfig``, ``load_config``: the run's config, from a dict or a YAML file.
- ``Task``, ``Trajectory``, ``Message``, ``trajectory_arrow_schema``: the rows in and out.
- ``read_tasks``: stream a task file.
- ``Environment``, ``tool``, ``ToolResult``, ``ToolError``, ``Episode``, ``Verification``:
  write an environment.
- ``ResetStepEnvironment``, ``ResetStepSession``, ``Opening``, ``StepResult``: bring an
  environment that is played by ``reset`` and ``step`` (a Gymnasium-style library).
- ``play_in_both_hostings``: test an environment: one episode inline and on Serve.
- ``Agent``, ``AgentEpisode``, ``EpisodeEnd``, ``OutOfTurns``: write an agent (the loop of
  an episode).
- ``RayrolloutError``, ``InputError``, ``PolicyBoundaryError``,
  ``EnvironmentBoundaryError``, ``OutputError``, ``ClusterError``: the base of every error
  rayrollout raises, and one base per boundary a failure crosses.
- ``InvalidTaskError``, ``InvalidTasksError``, ``OutputNotEmptyError``: the input errors a
  collect raises: a bad task row, rows that cannot run, an output folder holding an
  earlier run.

Everything else lives in the subpackages, is internal and may change. The one other public
package is ``rayrollout.client``, the HTTP client of the rollout service, which also installs
alone (``rayrollout-client``) beside a trainer without Ray.

Importing ``rayrollout`` is light: each name loads its module on first use (``__getattr__``),
so ``rayrollout --help``, ``rayrollout.client`` and a script that only reads a folder back
never pay for Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayrollout.agent import Agent, AgentEpisode, EpisodeEnd, OutOfTurns
    from rayrollout.api.collect import InvalidTasksError, OutputNotEmptyError
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
    from rayrollout.environment.reset_step import (
        Opening,
        ResetStepEnvironment,
        ResetStepSession,
        StepResult,
    )
    from rayrollout.environment.testing import play_in_both_hostings
    from rayrollout.errors import (
        ClusterError,
        EnvironmentBoundaryError,
        InputError,
        OutputError,
        PolicyBoundaryError,
        RayrolloutError,
    )

# Each public name -> the module defining it, imported when the name is first asked for.
_HOMES = {
    "RolloutEngine": "rayrollout.api.rollout_engine",
    "CollectResult": "rayrollout.api.rollout_engine",
    "read_trajectories": "rayrollout.api.rollout_engine",
    "RunConfig": "rayrollout.data.config",
    "load_config": "rayrollout.data.config",
    "Task": "rayrollout.data.schema",
    "Trajectory": "rayrollout.data.schema",
    "Message": "rayrollout.data.schema",
    "trajectory_arrow_schema": "rayrollout.data.schema",
    "read_tasks": "rayrollout.data.tasks",
    "Environment": "rayrollout.environment",
    "tool": "rayrollout.environment",
    "ToolResult": "rayrollout.environment",
    "ToolError": "rayrollout.environment",
    "Episode": "rayrollout.environment",
    "Verification": "rayrollout.environment",
    "ResetStepEnvironment": "rayrollout.environment.reset_step",
    "ResetStepSession": "rayrollout.environment.reset_step",
    "Opening": "rayrollout.environment.reset_step",
    "StepResult": "rayrollout.environment.reset_step",
    "play_in_both_hostings": "rayrollout.environment.testing",
    "Agent": "rayrollout.agent",
    "AgentEpisode": "rayrollout.agent",
    "EpisodeEnd": "rayrollout.agent",
    "OutOfTurns": "rayrollout.agent",
    "RayrolloutError": "rayrollout.errors",
    "InputError": "rayrollout.errors",
    "PolicyBoundaryError": "rayrollout.errors",
    "EnvironmentBoundaryError": "rayrollout.errors",
    "OutputError": "rayrollout.errors",
    "ClusterError": "rayrollout.errors",
    "InvalidTaskError": "rayrollout.data.tasks",
    "InvalidTasksError": "rayrollout.api.collect",
    "OutputNotEmptyError": "rayrollout.api.collect",
}

__all__ = [
    "Agent",
    "AgentEpisode",
    "ClusterError",
    "CollectResult",
    "Environment",
    "EnvironmentBoundaryError",
    "Episode",
    "EpisodeEnd",
    "InputError",
    "InvalidTaskError",
    "InvalidTasksError",
    "Message",
    "Opening",
    "OutOfTurns",
    "OutputError",
    "OutputNotEmptyError",
    "PolicyBoundaryError",
    "RayrolloutError",
    "ResetStepEnvironment",
    "ResetStepSession",
    "RolloutEngine",
    "RunConfig",
    "StepResult",
    "Task",
    "ToolError",
    "ToolResult",
    "Trajectory",
    "Verification",
    "load_config",
    "play_in_both_hostings",
    "read_tasks",
    "read_trajectories",
    "tool",
    "trajectory_arrow_schema",
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
