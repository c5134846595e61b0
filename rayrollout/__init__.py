"""rayrollout: a rollout engine for reinforcement learning of LLM agents, built on Ray.

Tasks go in, scored multi-turn trajectories come out, streamed to Parquet or JSONL.
"""

from rayrollout.api import CollectResult, RolloutEngine, read_trajectories
from rayrollout.config import RunConfig, load_config
from rayrollout.environment import Environment, Episode, ToolError, ToolResult, Verification, tool
from rayrollout.schema import Message, Task, Trajectory, trajectory_arrow_schema
from rayrollout.tasks import InvalidTaskError, read_tasks

__all__ = [
    "CollectResult",
    "Environment",
    "Episode",
    "InvalidTaskError",
    "Message",
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
