"""Bringing up what a run needs: Ray, Serve's HTTP proxy, and the policy application.

Environments are deployed by the engine when a task first needs them; the policy is
deployed here because every episode needs it from the first call.
"""

from __future__ import annotations

import logging
import os

import ray
from ray import serve

from rayrollout.data.config import RunConfig
from rayrollout.engine.placement import policy_actor_options

__all__ = ["PolicyEndpointError", "deploy_policy", "ensure_ray", "ensure_serve", "policy_app_name"]


class PolicyEndpointError(ValueError):
    """The config names no usable policy endpoint."""


def ensure_ray(config: RunConfig) -> None:
    """Join the configured cluster (or RAY_ADDRESS), or start a local Ray."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    kwargs: dict = {"namespace": config.namespace, "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(
            address="local",  # join a cluster only when RAY_ADDRESS or --address says so
            num_cpus=config.ray.num_cpus or max(2, os.cpu_count() or 2),
            include_dashboard=False,
            **kwargs,
        )


def ensure_serve(config: RunConfig) -> None:
    """Start Serve (or reuse the running one) with HTTP on the configured address."""
    serve.start(
        proxy_location=config.ray.serve_proxy_location,
        http_options={"host": config.ray.serve_host, "port": config.ray.serve_port},
        logging_config={"log_level": "WARNING"},
    )


def policy_app_name(namespace: str) -> str:
    return f"{namespace}.policy"


def deploy_policy(config: RunConfig) -> str:
    """Deploy the policy the config asks for (scripted, vLLM) and return its base URL."""
    policy = config.policy
    if policy.kind == "openai":
        if not policy.base_url:
            raise PolicyEndpointError(
                "policy kind 'openai' needs a base URL: pass --base-url URL (and --model NAME)"
            )
        return policy.base_url
    if policy.kind == "vllm":
        return _deploy_vllm(config)
    from rayrollout.deployments.scripted import scripted_policy_app

    ensure_serve(config)
    route = f"/{config.namespace}/policy"
    app = scripted_policy_app(
        replicas=policy.scripted.replicas,
        latency_s=policy.scripted.latency_s,
        model=policy.model,
        ray_actor_options=policy_actor_options(config, {"num_cpus": 0.1}),
    )
    serve.run(app, name=policy_app_name(config.namespace), route_prefix=route)
    return f"http://127.0.0.1:{config.ray.serve_port}{route}/v1"


def _deploy_vllm(config: RunConfig) -> str:
    """Deploy vLLM on Ray Serve LLM from policy.vllm_config; return its OpenAI base URL.

    The deployment file's ``client`` block and the served model fill every policy setting
    the run's config left unset (model name, tokenizer, token-ids mode, tool choice).
    """
    policy = config.policy
    if not policy.vllm_config:
        raise PolicyEndpointError(
            "policy kind 'vllm' needs a deployment file: pass --policy-config "
            "deployments/vllm/cpu.yaml (or set policy.vllm_config)"
        )
    from rayrollout.deployments.vllm.app import (
        build_vllm_app,
        load_vllm_config,
        resolve_model_source,
    )

    try:
        deployment = load_vllm_config(policy.vllm_config)
        source = resolve_model_source(deployment)
    except (ValueError, RuntimeError) as exc:
        raise PolicyEndpointError(str(exc)) from None
    defaults = {
        "model": deployment.model_id,
        "tokenizer": source,
        "prompt_mode": "token_ids",
        "return_token_ids": True,
        **deployment.client,
    }
    for name, value in defaults.items():
        if name not in policy.model_fields_set:
            setattr(policy, name, value)
    ensure_serve(config)
    route = f"/{config.namespace}/policy"
    app = build_vllm_app(deployment.model_copy(update={"model_source": source}))
    serve.run(app, name=policy_app_name(config.namespace), route_prefix=route)
    return f"http://127.0.0.1:{config.ray.serve_port}{route}/v1"
