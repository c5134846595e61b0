"""Run configuration; one job: the one pydantic model that YAML, CLI flags and Python fill.

Every field has a description, and unknown keys are errors (``extra="forbid"``), so a typo in
a YAML file fails loudly instead of being ignored. ``load_config`` merges a YAML file with
CLI overrides and validates once.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from rayrollout.data.config_model import ConfigModel
from rayrollout.data.environment_config import (
    DEFAULT_SESSION_IDLE_TIMEOUT_S,
    EnvironmentAutoscaling,
    EnvironmentConfig,
)
from rayrollout.data.errors import ConfigError
from rayrollout.data.run_folder import REJECTS_FILE
from rayrollout.data.service_config import ServiceConfig

__all__ = [
    "AgentSettings",
    "DEFAULT_AGENT",
    "DEFAULT_SESSION_IDLE_TIMEOUT_S",
    "RENAMED_KEYS",
    "ConfigError",
    "EnvironmentAutoscaling",
    "EnvironmentConfig",
    "EpisodeConfig",
    "OutputConfig",
    "PlacementConfig",
    "PolicyConfig",
    "RayConfig",
    "RunConfig",
    "ServiceConfig",
    "TrainingConfig",
    "WorkersConfig",
    "load_config",
]


S = TypeVar("S", bound=BaseModel)


class PolicyConfig(BaseModel):
    """Which policy answers, over which API, with which sampling and retry settings.

    These keys are every kind's; a kind's own settings (``vllm_config``, ``scripted``) sit
    beside them and are its own: ``settings_as`` validates them as the kind's settings model,
    unknown ones included, when rayrollout plans the run (this layer does not know the kinds
    a package may add, so the planner hands it the model the kind names).
    """

    model_config = ConfigDict(extra="allow")

    kind: str = Field(
        default="scripted",
        description="The policy kind, by name: 'scripted' (the built-in test policy on Ray "
        "Serve), 'openai' (any OpenAI-compatible endpoint at base_url), 'vllm' (vLLM on Ray "
        "Serve LLM), or one a package registers under the 'rayrollout.policies' entry point. "
        "The kind's own settings sit beside these keys (see 'Policy kinds' settings').",
    )
    tokenizer: str | None = Field(
        default=None,
        description="prompt_mode 'token_ids': path or Hugging Face id of the tokenizer whose "
        "chat template renders new messages (default: model; kind 'vllm' sets it).",
    )
    prompt_mode: Literal["messages", "token_ids"] = Field(
        default="messages",
        description="'messages': the server renders each prompt from the chat messages; "
        "'token_ids': the client keeps every turn's ids and sends prompt ids to "
        "/v1/completions, so each prompt extends the last exactly (vLLM).",
    )
    base_url: str | None = Field(
        default=None,
        description="Endpoint for kind 'openai', e.g. http://host:8000/v1; for kind 'vllm', "
        "the /v1 URL of a Ray Serve LLM app already up, with control endpoints.",
    )
    model: str = Field(default="scripted", description="Model name sent with every request.")
    api: Literal["chat", "responses"] = Field(
        default="chat", description="Chat Completions or the Responses API."
    )
    api_key_env: str = Field(
        default="OPENAI_API_KEY",
        description="Environment variable holding the API key (never logged).",
    )
    timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one policy call attempt.")
    max_retries: int = Field(
        default=3,
        ge=0,
        description="Retries with backoff on 429, 5xx, timeouts and connection errors.",
    )
    temperature: float | None = Field(
        default=None, ge=0, description="Default sampling temperature."
    )
    top_p: float | None = Field(
        default=None, gt=0, le=1, description="Default nucleus sampling mass."
    )
    max_tokens: int | None = Field(default=None, gt=0, description="Default tokens per model call.")
    tool_choice: Literal["auto", "required", "none"] = Field(
        default="auto",
        description="'required' forces a tool call on every turn but the last "
        "(structured outputs on vLLM); the last turn uses last_turn_tool_choice.",
    )
    last_turn_tool_choice: Literal["auto", "none"] = Field(
        default="none",
        description="Tool choice of an episode's last allowed turn when tool_choice is "
        "'required', so the model answers and the episode ends with a verdict.",
    )
    return_token_ids: bool = Field(
        default=False, description="Ask for token ids and logprobs (vLLM's return_token_ids)."
    )
    model_logprobs: Literal["constrained", "all", "off"] = Field(
        default="constrained",
        description="Which turns get the model's own logprobs by a second prefill of prompt "
        "+ completion (/completions with prompt_logprobs): 'constrained' (those a constraint "
        "shaped, whose sampled logprobs read 0.0 on forced tokens; others copy theirs), "
        "'all', 'off'. Needs token ids and logprobs (vLLM).",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Escape hatch: extra request fields passed as is (e.g. vLLM sampling params).",
    )

    @property
    def settings(self) -> dict[str, Any]:
        """The kind's own settings as given: every key that is not one of the common ones."""
        return dict(self.model_extra or {})

    def settings_as(self, model: type[S], *, checks: bool = True) -> S:
        """The kind's own settings (``settings``) validated as ``model``, the kind's settings
        model: its fields type them, and its validators, which find this section as
        ``info.context["policy"]``, are the kind's checks across its keys and the common
        ones (a ``ValueError`` naming the fix).

        Args:
            model: The kind's settings model.
            checks: Whether the kind's checks against this section run; False validates the
                kind's keys alone (no context), so a caller can put its own checks between.

        Raises:
            ConfigError: a setting the model refuses, named by its key (``policy.KEY``), or
                a check of the kind (``policy: ...``).
        """
        try:
            context = {"policy": self} if checks else None
            return model.model_validate(self.settings, context=context)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                where = ".".join(["policy", *map(str, error["loc"])])
                message = error["msg"]
                if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
                    message = self._not_a_setting(str(error["loc"][0]), model)
                elif error["type"] == "value_error" and not error["loc"]:
                    message = str(error.get("ctx", {}).get("error", message))
                problems.append(f"{where}: {message}")
            raise ConfigError("invalid config: " + "; ".join(problems)) from None

    def _not_a_setting(self, key: str, model: type[BaseModel]) -> str:
        """Why ``key`` is refused: neither a common policy key nor one of the kind's."""
        known = sorted({*type(self).model_fields, *model.model_fields})
        near = difflib.get_close_matches(key, known, n=1)
        own = ", ".join(sorted(model.model_fields)) or "none"
        hint = f" Did you mean '{near[0]}'?" if near else ""
        return (
            f"not a setting of policy kind '{self.kind}' (its own settings: {own}; the common "
            f"ones: docs/reference/config.md).{hint}"
        )


DEFAULT_AGENT = "tool_loop"
"""The agent of tasks and runs that name none: the built-in tool loop."""


class AgentSettings(ConfigModel):
    """One agent (episode loop) as a run's config names it: ``agent_settings: {NAME: ...}``."""

    path: str | None = Field(
        default=None,
        description="'module:Class' of the agent, for a name no package registers.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the agent's constructor."
    )


class WorkersConfig(ConfigModel):
    """The pool of worker actors: Ray actors that each play their share of the episodes,
    every episode with the agent its task names."""

    num_workers: int = Field(default=2, ge=1, description="Worker actors, named worker:<i>.")
    num_cpus: float = Field(default=0.1, gt=0, description="CPUs reserved per worker actor.")
    restart_deadline_s: float = Field(
        default=600.0,
        gt=0,
        description="How long the engine keeps resending a dead worker's unanswered episodes "
        "while Ray restarts the actor; only past it are they written as 'error' rows.",
    )


class EpisodeConfig(ConfigModel):
    """The limits of one episode, whichever agent plays it."""

    max_turns: int = Field(default=8, ge=1, description="Model calls per episode at most.")
    tool_timeout_s: float = Field(default=30.0, gt=0, description="Timeout of one tool call.")
    verify_timeout_s: float = Field(default=60.0, gt=0, description="Timeout of the verifier.")
    timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="Wall time an agent may take to play one episode (its model and tool "
        "calls included); past it the episode ends 'timeout' naming the agent.",
    )


RENAMED_KEYS = {
    "agents.num_agents": "workers.num_workers",
    "agents.num_cpus": "workers.num_cpus",
    "agents.restart_deadline_s": "workers.restart_deadline_s",
    "agents.max_turns": "episode.max_turns",
    "agents.tool_timeout_s": "episode.tool_timeout_s",
    "agents.verify_timeout_s": "episode.verify_timeout_s",
    "agents.episode_timeout_s": "episode.timeout_s",
    "placement.spread_agents": "placement.spread_workers",
}
"""Config keys of earlier versions and the keys that replaced them: "agent" names the
episode loop only, the pool of actors that play episodes is ``workers``."""


def _renamed_keys(data: dict[str, Any]) -> str | None:
    """One line naming the new key of each old key ``data`` holds; None when it holds none."""
    keys: list[str] = []  # the old keys given, as they are written
    moves: list[str] = []
    if "agents" in data:
        keys.append("agents")
        every = [key for key in RENAMED_KEYS if key.startswith("agents.")]
        inside = data["agents"] if isinstance(data["agents"], dict) else {}
        given = [key for key in every if key.partition(".")[2] in inside]
        # An empty or unknown 'agents' section: the whole map, so the reader finds theirs.
        moves += given or every
    placement = data.get("placement")
    if isinstance(placement, dict) and "spread_agents" in placement:
        keys.append("placement.spread_agents")
        moves.append("placement.spread_agents")
    if not keys:
        return None
    named = ", ".join(f"'{key}'" for key in keys)
    was = "keys {} were" if len(keys) > 1 else "key {} was"
    return f"config {was.format(named)} renamed: " + ", ".join(
        f"{old} -> {RENAMED_KEYS[old]}" for old in moves
    )


class OutputConfig(ConfigModel):
    """Where trajectories go and how they are cut into part files."""

    dir: str = Field(default="rollouts", description="Output folder of part files.")
    format: Literal["parquet", "jsonl"] = Field(default="parquet", description="Part file format.")
    rows_per_part: int = Field(default=1000, ge=1, description="Rows per part file at most.")
    flush_interval_s: float = Field(
        default=10.0, gt=0, description="Write a part at least this often while rows are waiting."
    )
    overwrite: bool = Field(
        default=False,
        description="Delete the parts (and rejects) an earlier run left in the folder before "
        "writing; without it (or 'resume') a folder with parts is refused.",
    )


class PlacementConfig(ConfigModel):
    """Which nodes run what: node roles are Ray custom resources the cluster's nodes declare.

    A GPU node started with ``ray start --resources '{"gpu_node": 1}'`` takes the policy's
    replicas when ``gpu_resource: gpu_node``; nodes with ``cpu_resource`` take the workers and
    the environment replicas. Unset (the default), nothing is constrained: one node works.
    """

    gpu_resource: str | None = Field(
        default=None,
        description="Custom resource marking GPU nodes; policy replicas require a sliver of it.",
    )
    cpu_resource: str | None = Field(
        default=None,
        description="Custom resource marking CPU nodes; workers, environment replicas and the "
        "engine require a sliver of it.",
    )
    amount: float = Field(
        default=0.001,
        gt=0,
        le=1,
        description="Amount of the role resource each actor requires (small: a role, not a quota).",
    )
    spread_workers: bool = Field(
        default=True, description="Spread worker actors across nodes (Ray's SPREAD strategy)."
    )

    def gpu_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Ray actor ``options`` plus the GPU-node role, if named (policy replicas)."""
        return self._with_role(options, self.gpu_resource)

    def cpu_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Ray actor ``options`` plus the CPU-node role, if named (workers, environment
        replicas, the engine). Here, not in the engine, because environment hosting (a
        lower layer) places its replicas too."""
        return self._with_role(options, self.cpu_resource)

    def _with_role(self, options: dict[str, Any], resource: str | None) -> dict[str, Any]:
        merged = dict(options)
        if resource:
            merged["resources"] = {**merged.get("resources", {}), resource: self.amount}
        return merged


class RayConfig(ConfigModel):
    """Which Ray cluster to use and where Serve listens."""

    address: str | None = Field(
        default=None,
        description="Ray cluster to join ('auto', ray://...); None starts a local one unless "
        "RAY_ADDRESS is set.",
    )
    num_cpus: int | None = Field(default=None, description="CPUs of a local Ray (default: all).")
    head_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="GCS port of the local Ray head `rayrollout up` starts when no cluster is "
        "named (0: any free port).",
    )
    temp_dir: str | None = Field(
        default=None,
        description="Temp folder of the local Ray head `rayrollout up` starts (its sockets "
        "and logs); None: Ray's own (/tmp/ray).",
    )
    serve_host: str = Field(default="127.0.0.1", description="Serve HTTP bind address.")
    serve_port: int = Field(
        default=8000,
        description="Serve HTTP port. One another program holds on the node is refused by name "
        "before Serve starts.",
    )
    serve_proxy_location: Literal["EveryNode", "HeadOnly"] = Field(
        default="EveryNode",
        description="Where Serve runs HTTP proxies: 'EveryNode' lets workers on any node reach "
        "the policy at 127.0.0.1; 'HeadOnly' when several Ray nodes share one host (tests).",
    )


PauseMode = Literal["wait", "abort_and_retry", "continue", "interrupt"]
"""What ``pause()`` does to model calls in flight (``TrainingConfig.pause_mode``)."""
PAUSE_MODES: tuple[PauseMode, ...] = get_args(PauseMode)


class TrainingConfig(ConfigModel):
    """How the engine's training-loop methods behave (``generate``, ``pause``, weights)."""

    pause_mode: PauseMode = Field(
        default="wait",
        description="What pause() does to model calls in flight (new calls always wait): "
        "'wait' lets them finish under the old weights before pause() returns; "
        "'abort_and_retry' cancels them and sends them again after resume() under the new "
        "version; 'interrupt' stops them at once, keeps the tokens generated so far and "
        "continues each from them under the new weights after resume() (kinds that can: "
        "vllm in token-ids mode); 'continue' returns at once and lets them go on (on vllm "
        "as 'interrupt'; refused with prompt_mode 'messages', whose chat answers do not say "
        "where an update cut them). Every token records the version that made it "
        "(Turn.token_versions).",
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description="Versions the policy may move on during one token sequence (with the "
        "built-in loop: the episode): a model call more than this many versions after the "
        "first turn of the sequence it extends restarts the episode under the current "
        "weights. An agent that trims its history starts a new sequence, measured afresh. "
        "None: no bound.",
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="generate(): drop groups whose rewards are all equal (no GRPO signal) "
        "and top the batch up with more groups, within max_extra_groups.",
    )
    max_extra_groups: int | None = Field(
        default=None,
        ge=0,
        description="Dynamic sampling: groups run beyond the batch at most, per generate() "
        "call (None: as many as the batch has groups).",
    )
    write_trajectories: bool = Field(
        default=False,
        description="generate(): also write the trajectories it returns to the output folder.",
    )
    weights_roots: list[str] | None = Field(
        default=None,
        description="Folders a checkpoint given to update_weights() must lie under, as "
        "absolute paths; the checkpoint's path is resolved (symlinks, '..') before it is "
        "compared. None: the run's output folder and the system temp folder. A path outside "
        "them, relative, missing or unreadable is refused by name before the policy pauses.",
    )

    @model_validator(mode="after")
    def _weights_roots_are_absolute(self) -> TrainingConfig:
        relative = [root for root in self.weights_roots or () if not Path(root).is_absolute()]
        if relative:
            raise ValueError(
                f"weights_roots must be absolute folders (the engine resolves nothing against "
                f"its own working directory): got {relative[0]!r}"
            )
        return self


class RunConfig(ConfigModel):
    """Everything one run needs; the YAML file, the CLI flags and Python all fill this."""

    namespace: str = Field(
        default="rayrollout", description="Ray namespace scoping the run's actors and apps."
    )
    tasks: str | None = Field(default=None, description="Tasks file (JSONL or Parquet).")
    environment: str | None = Field(
        default=None, description="Environment for task rows that name none."
    )
    agent: str | None = Field(
        default=None,
        description="Agent (episode loop) for task rows that name none; None: the "
        "environment's own default ('reset_step' for reset/step sources), else 'tool_loop'.",
    )
    agent_settings: dict[str, AgentSettings] = Field(
        default_factory=dict, description="Per-agent settings (path, args), by agent name."
    )
    num_repeats: int = Field(default=1, ge=1, description="Samples per task.")
    concurrency: int = Field(
        default=256,
        ge=1,
        description=(
            "Episodes running at once, at most (workers may hold up to a chunk more each, waiting)."
        ),
    )
    limit: int | None = Field(default=None, ge=1, description="Read at most this many tasks.")
    resume: bool = Field(
        default=False, description="Skip (task_id, sample_index) pairs already written."
    )
    skip_invalid: bool = Field(
        default=False,
        description=f"Run the valid rows and write bad ones to {REJECTS_FILE} in the output "
        "folder.",
    )
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    environments: dict[str, EnvironmentConfig] = Field(
        default_factory=dict, description="Per-environment settings, by name."
    )
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    service: ServiceConfig = Field(
        default_factory=ServiceConfig,
        description="The HTTP rollout API `rayrollout up` starts (docs/how-to/service.md).",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_renamed_keys(cls, data: Any) -> Any:
        # Here, not in load_config: YAML, flags, Python and the service's config all pass.
        if isinstance(data, dict):
            renamed = _renamed_keys(data)
            if renamed is not None:
                raise PydanticCustomError("renamed_key", renamed)
        return data

    def environment_config(self, name: str) -> EnvironmentConfig:
        """Settings of one environment (defaults when the config names it not)."""
        return self.environments.get(name) or EnvironmentConfig()

    def agent_config(self, name: str) -> AgentSettings:
        """Settings of one agent (defaults when the config names it not)."""
        return self.agent_settings.get(name) or AgentSettings()


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """Read a YAML config (optional), apply overrides (CLI flags), validate once."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config {path} must be a YAML mapping at the top level")
    data = _merge(data, overrides or {})
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_problem(e["loc"], e["msg"]) for e in exc.errors())
        raise ConfigError(f"invalid config{f' {path}' if path else ''}: {problems}") from None


def _problem(loc: tuple[int | str, ...], message: str) -> str:
    """One validation error as ``key.path: message`` (the message alone for the whole config)."""
    return f"{'.'.join(map(str, loc))}: {message}" if loc else message
