"""rayrollout: a rollout engine for reinforcement learning of LLM agents, built on Ray.

Tasks go in, scored multi-turn trajectories come out, streamed to Parquet or JSONL.
"""

from rayrollout.api.rollout_engine import CollectResult, RolloutEngine, read_trajectories
from rayrollout.data.config import RunConfig, load_config
from rayrollout.data.schema import Message, Task, Trajectory, trajectory_arrow_schema
from rayrollout.data.tasks import InvalidTaskError, read_tasks
from rayrollout.environment import Environment, Episode, ToolError, ToolResult, Verification, tool

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
