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
- ``PolicyKind``, ``OwnServer``, ``FixedWeights``, ``kind_settings``: write a policy kind
  (how a model server is brought up, its own settings, its weight updates).
- ``RayrolloutError``, ``InputError``, ``PolicyBoundaryError``,
  ``EnvironmentBoundaryError``, ``OutputError``, ``ClusterError``: the base of every error
  rayrollout raises, and one base per boundary a failure crosses.
- ``InvalidTaskError``, ``InvalidTasksError``, ``OutputNotEmptyError``: the input errors a
  collect raises: a bad task row, rows that cannot run, an output folder holding an
  earlier run.

Every other error class of the tree imports from here too (``_ERROR_HOMES``), so "what can
this raise" has one place to look; docs/reference/errors.md draws the whole tree.

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
    from rayrollout.agentkit import Agent, AgentEpisode, EpisodeEnd, OutOfTurns
    from rayrollout.agentkit.errors import (
        AgentArgsError,
        BadRequest,
        FrontPortTaken,
        UnknownAgentError,
    )
    from rayrollout.api.errors import (
        CursorGoneError,
        EngineDiedError,
        EngineExistsError,
        EnvironmentCheckError,
        EnvironmentUnavailableError,
        EnvironmentUrlError,
        InvalidTasksError,
        NotUpError,
        OpenJournalsError,
        OutputFolderError,
        OutputNotEmptyError,
        PolicyCheckError,
        PreflightError,
        TasksFileError,
    )
    from rayrollout.api.rollout_engine import CollectResult, RolloutEngine, read_trajectories
    from rayrollout.client.errors import (
        BadRequestError,
        BatchConflictError,
        BatchNotFoundError,
        EngineGoneError,
        ServiceBusyError,
        ServiceError,
        UnauthorizedError,
    )
    from rayrollout.data.config import RunConfig, load_config
    from rayrollout.data.errors import (
        ConfigError,
        EmptyRunError,
        ExportError,
        HeadReadError,
        ImageError,
        InvalidTaskError,
        LateImages,
        PartError,
        RowRefused,
        ShardReadError,
        WriterError,
    )
    from rayrollout.data.schema import Message, Task, Trajectory, trajectory_arrow_schema
    from rayrollout.data.tasks import read_tasks
    from rayrollout.engine.errors import LocalHeadError, PolicyEndpointError, WeightsPathError
    from rayrollout.envkit import Environment, Episode, ToolError, ToolResult, Verification, tool
    from rayrollout.envkit.errors import (
        ActionRejected,
        DuplicateEnvironmentError,
        EnvironmentArgsError,
        EnvironmentLost,
        EnvironmentRoutingError,
        EnvironmentSetupFailed,
        NemoGymError,
        OpenEnvError,
        ResetStepError,
        SessionNotOpen,
        ToolCallRejected,
        UnknownEnvironmentError,
    )
    from rayrollout.envkit.reset_step import (
        Opening,
        ResetStepEnvironment,
        ResetStepSession,
        StepResult,
    )
    from rayrollout.envkit.testing import play_in_both_hostings
    from rayrollout.errors import (
        ClusterError,
        EnvironmentBoundaryError,
        EpisodesFailedError,
        InputError,
        OutputError,
        PolicyBoundaryError,
        RayrolloutError,
    )
    from rayrollout.integrations.errors import TooManyDroppedError, TooManyFailuresError
    from rayrollout.policy.errors import (
        HttpStatusError,
        HttpTimeout,
        HttpTransportError,
        PolicyError,
        PolicyTimeout,
        StaleEpisode,
        TemplateError,
        UnknownPolicyKindError,
        WeightUpdateError,
    )
    from rayrollout.policy.kinds import (
        FixedWeights,
        OwnServer,
        PolicyKind,
        kind_settings,
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
    "Environment": "rayrollout.envkit",
    "tool": "rayrollout.envkit",
    "ToolResult": "rayrollout.envkit",
    "ToolError": "rayrollout.envkit.errors",
    "Episode": "rayrollout.envkit",
    "Verification": "rayrollout.envkit",
    "ResetStepEnvironment": "rayrollout.envkit.reset_step",
    "ResetStepSession": "rayrollout.envkit.reset_step",
    "Opening": "rayrollout.envkit.reset_step",
    "StepResult": "rayrollout.envkit.reset_step",
    "play_in_both_hostings": "rayrollout.envkit.testing",
    "Agent": "rayrollout.agentkit",
    "AgentEpisode": "rayrollout.agentkit",
    "EpisodeEnd": "rayrollout.agentkit",
    "OutOfTurns": "rayrollout.agentkit",
    "PolicyKind": "rayrollout.policy.kinds",
    "OwnServer": "rayrollout.policy.kinds",
    "FixedWeights": "rayrollout.policy.kinds",
    "kind_settings": "rayrollout.policy.kinds",
    "RayrolloutError": "rayrollout.errors",
    "InputError": "rayrollout.errors",
    "PolicyBoundaryError": "rayrollout.errors",
    "EnvironmentBoundaryError": "rayrollout.errors",
    "OutputError": "rayrollout.errors",
    "ClusterError": "rayrollout.errors",
    "InvalidTaskError": "rayrollout.data.errors",
    "InvalidTasksError": "rayrollout.api.errors",
    "OutputNotEmptyError": "rayrollout.api.errors",
}

# Every other public class of the error tree -> its module, so any error imports from here.
# tests/test_public_api.py walks the tree and holds this to it (the CLI's own errors and
# private classes excepted); docs/reference/errors.md draws it.
_ERROR_HOMES = {
    "ActionRejected": "rayrollout.envkit.errors",
    "AgentArgsError": "rayrollout.agentkit.errors",
    "BadRequest": "rayrollout.agentkit.errors",
    "BadRequestError": "rayrollout.client.errors",
    "BatchConflictError": "rayrollout.client.errors",
    "BatchNotFoundError": "rayrollout.client.errors",
    "ConfigError": "rayrollout.data.errors",
    "CursorGoneError": "rayrollout.api.errors",
    "DuplicateEnvironmentError": "rayrollout.envkit.errors",
    "EmptyRunError": "rayrollout.data.errors",
    "EngineDiedError": "rayrollout.api.errors",
    "EngineExistsError": "rayrollout.api.errors",
    "EngineGoneError": "rayrollout.client.errors",
    "EnvironmentArgsError": "rayrollout.envkit.errors",
    "EnvironmentCheckError": "rayrollout.api.errors",
    "EnvironmentLost": "rayrollout.envkit.errors",
    "EnvironmentRoutingError": "rayrollout.envkit.errors",
    "EnvironmentSetupFailed": "rayrollout.envkit.errors",
    "EnvironmentUnavailableError": "rayrollout.api.errors",
    "EnvironmentUrlError": "rayrollout.api.errors",
    "EpisodesFailedError": "rayrollout.errors",
    "ExportError": "rayrollout.data.errors",
    "FrontPortTaken": "rayrollout.agentkit.errors",
    "HeadReadError": "rayrollout.data.errors",
    "HttpStatusError": "rayrollout.policy.errors",
    "HttpTimeout": "rayrollout.policy.errors",
    "HttpTransportError": "rayrollout.policy.errors",
    "ImageError": "rayrollout.data.errors",
    "LateImages": "rayrollout.data.errors",
    "LocalHeadError": "rayrollout.engine.errors",
    "NemoGymError": "rayrollout.envkit.errors",
    "OpenEnvError": "rayrollout.envkit.errors",
    "OpenJournalsError": "rayrollout.api.errors",
    "OutputFolderError": "rayrollout.api.errors",
    "PartError": "rayrollout.data.errors",
    "PolicyCheckError": "rayrollout.api.errors",
    "PolicyEndpointError": "rayrollout.engine.errors",
    "PolicyError": "rayrollout.policy.errors",
    "PolicyTimeout": "rayrollout.policy.errors",
    "PreflightError": "rayrollout.api.errors",
    "ResetStepError": "rayrollout.envkit.errors",
    "RowRefused": "rayrollout.data.errors",
    "ServiceBusyError": "rayrollout.client.errors",
    "ServiceError": "rayrollout.client.errors",
    "NotUpError": "rayrollout.api.errors",
    "SessionNotOpen": "rayrollout.envkit.errors",
    "ShardReadError": "rayrollout.data.errors",
    "StaleEpisode": "rayrollout.policy.errors",
    "TasksFileError": "rayrollout.api.errors",
    "TemplateError": "rayrollout.policy.errors",
    "TooManyDroppedError": "rayrollout.integrations.errors",
    "TooManyFailuresError": "rayrollout.integrations.errors",
    "ToolCallRejected": "rayrollout.envkit.errors",
    "UnauthorizedError": "rayrollout.client.errors",
    "UnknownAgentError": "rayrollout.agentkit.errors",
    "UnknownEnvironmentError": "rayrollout.envkit.errors",
    "UnknownPolicyKindError": "rayrollout.policy.errors",
    "WeightUpdateError": "rayrollout.policy.errors",
    "WeightsPathError": "rayrollout.engine.errors",
    "WriterError": "rayrollout.data.errors",
}
_HOMES.update(_ERROR_HOMES)

__all__ = [
    "Agent",
    "AgentEpisode",
    "ClusterError",
    "CollectResult",
    "Environment",
    "EnvironmentBoundaryError",
    "Episode",
    "EpisodeEnd",
    "FixedWeights",
    "InputError",
    "InvalidTaskError",
    "InvalidTasksError",
    "Message",
    "Opening",
    "OutOfTurns",
    "NotUpError",
    "OutputError",
    "OutputNotEmptyError",
    "OwnServer",
    "PolicyBoundaryError",
    "PolicyKind",
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
    "kind_settings",
    "load_config",
    "play_in_both_hostings",
    "read_tasks",
    "read_trajectories",
    "tool",
    "trajectory_arrow_schema",
]
__all__ += [  # the rest of the error tree (_ERROR_HOMES)
    "ActionRejected",
    "AgentArgsError",
    "BadRequest",
    "BadRequestError",
    "BatchConflictError",
    "BatchNotFoundError",
    "ConfigError",
    "CursorGoneError",
    "DuplicateEnvironmentError",
    "EmptyRunError",
    "EngineDiedError",
    "EngineExistsError",
    "EngineGoneError",
    "EnvironmentArgsError",
    "EnvironmentCheckError",
    "EnvironmentLost",
    "EnvironmentRoutingError",
    "EnvironmentSetupFailed",
    "EnvironmentUnavailableError",
    "EnvironmentUrlError",
    "EpisodesFailedError",
    "ExportError",
    "FrontPortTaken",
    "HeadReadError",
    "HttpStatusError",
    "HttpTimeout",
    "HttpTransportError",
    "ImageError",
    "LateImages",
    "LocalHeadError",
    "NemoGymError",
    "OpenEnvError",
    "OpenJournalsError",
    "OutputFolderError",
    "PartError",
    "PolicyCheckError",
    "PolicyEndpointError",
    "PolicyError",
    "PolicyTimeout",
    "PreflightError",
    "ResetStepError",
    "RowRefused",
    "ServiceBusyError",
    "ServiceError",
    "SessionNotOpen",
    "ShardReadError",
    "StaleEpisode",
    "TasksFileError",
    "TemplateError",
    "TooManyDroppedError",
    "TooManyFailuresError",
    "ToolCallRejected",
    "UnauthorizedError",
    "UnknownAgentError",
    "UnknownEnvironmentError",
    "UnknownPolicyKindError",
    "WeightUpdateError",
    "WeightsPathError",
    "WriterError",
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
