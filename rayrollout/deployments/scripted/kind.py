"""The scripted policy as a policy kind (``policy.kind: scripted``): its settings, its app
and its weights.

Registered under the ``rayrollout.policies`` entry point (pyproject.toml); the engine finds
it by name (``rayrollout.policy.kinds``). Its settings are ``policy.scripted``. A new
version changes nothing in a scripted policy (a test double for the model's judgement) but
the version every turn records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import ray
from pydantic import Field

from rayrollout.auth import RouteAuth
from rayrollout.data.config import RunConfig
from rayrollout.data.config_model import ConfigModel
from rayrollout.deployments.scripted.local import LocalScriptedPolicy
from rayrollout.policy.kinds import FixedWeights, OwnServer, PolicyKind, kind_settings
from rayrollout.ports import free_port

if TYPE_CHECKING:
    from ray import serve

__all__ = ["SCRIPTED", "ScriptedPolicyConfig", "ScriptedSettings", "ScriptedWeights"]


class ScriptedPolicyConfig(ConfigModel):
    """Settings of the built-in scripted policy (a stand-in for a model in tests and demos)."""

    replicas: int = Field(default=1, ge=1, description="Serve replicas of the scripted policy.")
    latency_s: float = Field(
        default=0.0, ge=0.0, description="Think time added to every call (latency benchmarks)."
    )
    hosting: Literal["serve", "actor"] = Field(
        default="serve",
        description="'serve': a Ray Serve app (replicas, placement, a detached engine); "
        "'actor': one plain Ray actor on the driver's node, started in a second with no "
        "Serve, ending with the driver (the demo's; not for `rayrollout up`).",
    )


class ScriptedSettings(ConfigModel):
    """The scripted kind's own ``policy:`` keys."""

    scripted: ScriptedPolicyConfig = Field(
        default_factory=ScriptedPolicyConfig,
        description="Settings of the built-in scripted policy (a stand-in for a model in "
        "tests and demos).",
    )


def scripted_settings(config: RunConfig) -> ScriptedPolicyConfig:
    """``policy.scripted`` of ``config``, checked."""
    return kind_settings(config, ScriptedSettings).scripted


def build_scripted_app(config: RunConfig, auth: RouteAuth) -> serve.Application | OwnServer:
    """The scripted policy's Serve app from ``policy.scripted``, placed on GPU-node roles,
    its routes taking the bearers ``auth`` accepts; with ``hosting: actor``, its own server
    on a free port of this node instead (``actor_server``).

    The server module (Ray Serve, over a second of imports) loads here, once Ray is up,
    not when the kind is looked up by name: the checks before Ray starts look it up."""
    scripted = scripted_settings(config)
    if scripted.hosting == "actor":
        return _own_server(config, auth)
    from rayrollout.deployments.scripted.app import scripted_policy_app

    return scripted_policy_app(
        replicas=scripted.replicas,
        latency_s=scripted.latency_s,
        model=config.policy.model,
        ray_actor_options=config.placement.gpu_options({"num_cpus": 0.1}),
        auth=auth,
    )


def _own_server(config: RunConfig, auth: RouteAuth) -> OwnServer:
    """The actor-hosted server: its port found free here, where the actor will run."""
    from rayrollout.deployments.scripted.actor_server import (
        start_scripted_server,
        stop_scripted_server,
    )

    host = config.ray.serve_host
    port = free_port(host)
    url_host = ray.util.get_node_ip_address() if host in ("0.0.0.0", "::", "") else host
    url_host = f"[{url_host}]" if ":" in url_host else url_host
    name = f"scripted-policy-{port}"

    def start() -> Callable[[], None]:
        scripted = scripted_settings(config)
        start_scripted_server(
            name, config.namespace, host, port, scripted.latency_s, config.policy.model, auth
        )
        return lambda: stop_scripted_server(name)

    return OwnServer(f"http://{url_host}:{port}/v1", start)


class ScriptedWeights(FixedWeights):
    """Nothing to pause or load: the version moves, the script stays."""

    async def load(self, path: str) -> dict[str, Any]:
        return {"backend": "scripted", "path": path}


def local_scripted_policy(config: RunConfig) -> LocalScriptedPolicy:
    """The scripted policy in this process (``rayrollout agent test``)."""
    return LocalScriptedPolicy(config.policy)


def _ends_with_the_driver(config: RunConfig) -> str | None:
    if scripted_settings(config).hosting != "actor":
        return None
    return (
        "policy.scripted.hosting 'actor' ends with the driver that starts it; an engine that "
        "outlives its driver (rayrollout up) needs 'serve'"
    )


SCRIPTED = PolicyKind(
    "scripted",
    build_scripted_app,
    lambda config, url, token: ScriptedWeights(),
    local=local_scripted_policy,
    settings_model=ScriptedSettings,
    driver_bound=_ends_with_the_driver,
)
