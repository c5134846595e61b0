"""Bringing up what a run needs: Ray, Serve's HTTP proxy, and the policy application.

Environments are deployed by the engine when a task first needs them (``deploy``); the
policy is deployed here because every episode needs it from the first call. Its kind is
found by name (``rayrollout.policy.kinds``), so nothing here imports a deployment by name.
"""

from __future__ import annotations

import logging
import os

import ray
from ray import serve

from rayrollout.data.config import RunConfig
from rayrollout.engine.secret_env import without_secrets
from rayrollout.errors import InputError
from rayrollout.policy.kinds import policy_kind

__all__ = [
    "PolicyEndpointError",
    "deploy_policy",
    "ensure_ray",
    "ensure_serve",
    "policy_app_name",
]


class PolicyEndpointError(InputError, ValueError):
    """The config names no usable policy endpoint."""


def ensure_ray(config: RunConfig) -> None:
    """Join the configured cluster (or RAY_ADDRESS), or start a local Ray.

    A local Ray starts without the driver's secrets (``secrets.without_secrets``): the
    GCS, the raylet and every worker it forks inherit the environment ``ray.init`` runs
    in, and tool code in an environment replica can read its own or its parent's. The
    policy key reaches the agents as a constructor argument instead (``secrets``).
    """
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    kwargs: dict = {"namespace": config.namespace, "logging_level": logging.WARNING}
    if address:  # a cluster started by someone else: its workers' environment is theirs
        ray.init(address=address, **kwargs)
        return
    with without_secrets(extra=[config.policy.api_key_env]):
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
    """Deploy the policy the config asks for and return its OpenAI base URL.

    The kind (``policy.kind``) is found by name (``rayrollout.policy.kinds``): a deployed
    kind (scripted, vLLM) is run on Serve here; an external server (``openai``) is used at
    ``policy.base_url``.
    """
    policy = config.policy
    try:
        kind = policy_kind(policy.kind)
        app = kind.build_app(config) if kind.build_app is not None else None
    except (ValueError, RuntimeError) as exc:  # a deployment file missing, wrong, unreadable
        raise PolicyEndpointError(str(exc)) from None
    if app is None:
        if not policy.base_url:
            raise PolicyEndpointError(
                f"policy kind '{policy.kind}' needs a base URL: pass --base-url URL "
                "(and --model NAME)"
            )
        return policy.base_url
    ensure_serve(config)
    route = f"/{config.namespace}/policy"
    serve.run(app, name=policy_app_name(config.namespace), route_prefix=route)
    return f"http://127.0.0.1:{config.ray.serve_port}{route}/v1"
