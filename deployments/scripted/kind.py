"""The scripted policy as a policy kind (``policy.kind: scripted``): its app and its weights.

Registered under the ``rayrollout.policies`` entry point (pyproject.toml); the engine finds
it by name (``rayrollout.policy.kinds``). A new version changes nothing in a scripted
policy (a test double for the model's judgement) but the version every turn records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayrollout.deployments.scripted.local import LocalScriptedPolicy

from rayrollout.auth import RouteAuth
from rayrollout.data.config import RunConfig
from rayrollout.policy.kinds import FixedWeights, PolicyKind

if TYPE_CHECKING:
    from ray import serve

__all__ = ["SCRIPTED", "ScriptedWeights"]


def build_scripted_app(config: RunConfig, auth: RouteAuth) -> serve.Application:
    """The scripted policy's Serve app from ``policy.scripted``, placed on GPU-node roles,
    its routes taking the bearers ``auth`` accepts.

    The server module (Ray Serve, over a second of imports) loads here, once Ray is up,
    not when the kind is looked up by name: the checks before Ray starts look it up."""
    from rayrollout.deployments.scripted.server import scripted_policy_app

    policy = config.policy
    return scripted_policy_app(
        replicas=policy.scripted.replicas,
        latency_s=policy.scripted.latency_s,
        model=policy.model,
        ray_actor_options=config.placement.gpu_options({"num_cpus": 0.1}),
        auth=auth,
    )


class ScriptedWeights(FixedWeights):
    """Nothing to pause or load: the version moves, the script stays."""

    async def load(self, path: str) -> dict[str, Any]:
        return {"backend": "scripted", "path": path}


def local_scripted_policy(config: RunConfig) -> LocalScriptedPolicy:
    """The scripted policy in this process (``rayrollout agent test``)."""
    return LocalScriptedPolicy(config.policy)


SCRIPTED = PolicyKind(
    "scripted",
    build_scripted_app,
    lambda config, url, token: ScriptedWeights(),
    local=local_scripted_policy,
)
