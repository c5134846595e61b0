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
"""

from rayrollout.api.rollout_engine import CollectResult, RolloutEngine, read_trajectories
from rayrollout.data.config import RunConfig, load_config
from rayrollout.data.schema import Message, Task, Trajectory, trajectory_arrow_schema
from rayrollout.data.tasks import InvalidTaskError, read_tasks
from rayrollout.environment import Environment, Episode, ToolError, ToolResult, Verification, tool
from rayrollout.errors import RayrolloutError

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
