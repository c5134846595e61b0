"""vLLM as a policy kind (``policy.kind: vllm``): its settings, its Ray Serve LLM app and its
weight updates.

Registered under the ``rayrollout.policies`` entry point (pyproject.toml); the engine finds
it by name (``rayrollout.policy.kinds``). Its one setting is ``policy.vllm_config``, the
deployment file.

Weight updates go over the app's control endpoints (Ray's ``DevIngress``, deployed with
``control_endpoints: true``): ``POST /pause`` (vLLM's ``pause_generation`` on every replica,
KV and prefix caches cleared), ``POST /collective_rpc`` of
``rayrollout_reload_weights(weights_path=...)`` (every worker of every replica reloads the
checkpoint in place; ``weight_reload.py``), ``POST /resume``. A run whose ``policy.base_url`` names
an app of this kind already up (deployed by another run, in another namespace) deploys
nothing and sends those calls there, with the policy key (``policy.api_key_env``): the key
that app's routes take.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from pydantic import Field, ValidationInfo, model_validator

from rayrollout.auth import RouteAuth, bearer_header
from rayrollout.data.config import PolicyConfig, RunConfig
from rayrollout.data.config_model import ConfigModel
from rayrollout.deployments.vllm.app import build_vllm_app, load_vllm_config, resolve_model_source
from rayrollout.deployments.vllm.weight_reload import RELOAD_METHOD
from rayrollout.policy.gate import PauseMode
from rayrollout.policy.kinds import PolicyKind, WeightUpdateError, kind_settings

__all__ = ["VLLM", "VllmSettings", "VllmWeights", "build_vllm_policy_app"]

# vLLM's pause_generation mode per rayrollout pause mode: agents have already finished
# ('wait') or cancelled ('abort_and_retry') their calls; 'interrupt' aborts those in flight,
# which answer with their tokens so far, and the gate continues them after resume. So does
# 'continue' in token-ids mode (each token's version is then known). With prompt_mode
# 'messages' the engine refuses 'continue' (kinds.continue_refusal); this backend, used
# without it, freezes such calls ('keep'), since a stopped chat call could not go on.
_VLLM_PAUSE = {
    "wait": "keep",
    "abort_and_retry": "abort",
    "continue": "abort",
    "interrupt": "abort",
}
_CONTROL_TIMEOUT_S = 600.0


class VllmSettings(ConfigModel):
    """The vLLM kind's own ``policy:`` keys, and what the run's policy section cannot ask of
    a vLLM app: refused before anything starts rather than as a 404 on every episode of a
    run that took minutes to start."""

    vllm_config: str | None = Field(
        default=None,
        description="Path of the deployment YAML (rayrollout/deployments/vllm/cpu.yaml); "
        "unset with "
        "base_url: the app already up there.",
    )

    @model_validator(mode="after")
    def _fits_the_policy_section(self, info: ValidationInfo) -> VllmSettings:
        policy: PolicyConfig | None = (info.context or {}).get("policy")
        if policy is None:  # the settings alone: nothing to check them against
            return self
        if policy.api == "responses" and policy.prompt_mode == "messages":
            raise ValueError(
                "api 'responses' does not work with kind 'vllm': Ray Serve LLM's ingress has "
                "no /v1/responses. Use api: chat, or prompt_mode: token_ids (/v1/completions)"
            )
        if policy.base_url and self.vllm_config:
            raise ValueError(
                "kind 'vllm' takes vllm_config (the run deploys that app) or base_url (an app "
                "already up), not both: leave one out"
            )
        return self


def _interrupt_refusal(config: RunConfig) -> str | None:
    """A stopped call goes on from its kept token ids: only in token-ids mode."""
    policy = config.policy
    if policy.prompt_mode == "messages" and (
        "prompt_mode" in policy.model_fields_set or policy.base_url
    ):
        return (
            "pause_mode 'interrupt' continues a stopped call from its kept token ids: set "
            "policy.prompt_mode: token_ids"
        )
    return None


def build_vllm_policy_app(config: RunConfig, auth: RouteAuth) -> Any:
    """vLLM on Ray Serve LLM from ``policy.vllm_config``; a ``serve.Application`` whose
    routes (``/v1`` and the control routes) take the bearers ``auth`` accepts.

    The deployment file's ``client`` block and the served model fill every policy setting
    the run's config left unset (model name, tokenizer, token-ids mode, tool choice).
    Raises ``ValueError`` naming what is missing or wrong in the file.
    """
    policy = config.policy
    vllm_config = kind_settings(config, VllmSettings).vllm_config
    if not vllm_config:
        raise ValueError(
            "policy kind 'vllm' needs a deployment file: pass --policy-config "
            "rayrollout/deployments/vllm/cpu.yaml (or set policy.vllm_config)"
        )
    deployment = load_vllm_config(vllm_config)
    source = resolve_model_source(deployment)
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
    return build_vllm_app(deployment.model_copy(update={"model_source": source}), auth=auth)


class VllmWeights:
    """Ray Serve LLM's control endpoints (``DevIngress``), next to the app's ``/v1``, called
    with the run's token (they pause the model and run code in its workers)."""

    def __init__(
        self, policy_url: str, model: str, token: str | None = None, token_ids: bool = True
    ) -> None:
        self.base = policy_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.token_ids = token_ids  # calls can go on from kept ids (prompt_mode token_ids)
        self.headers = bearer_header(token) if token else {}

    async def _post(self, route: str, body: dict[str, Any]) -> Any:
        url = f"{self.base}/{route}"
        timeout = aiohttp.ClientTimeout(total=_CONTROL_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as http:
            async with http.post(url, json={"model": self.model, **body}) as response:
                text = await response.text()
                if response.status == 404:
                    raise WeightUpdateError(
                        f"POST {url} answered 404: the vLLM app has no control endpoints; "
                        "deploy it with `control_endpoints: true` in its deployment file "
                        "(rayrollout/deployments/vllm/)"
                    )
                if response.status >= 400:
                    raise WeightUpdateError(
                        f"POST {url} answered HTTP {response.status}: {text[:500]}"
                    )
                return await response.json() if text else None

    async def pause(self, mode: PauseMode) -> None:
        vllm_mode = _VLLM_PAUSE[mode]
        if mode == "continue" and not self.token_ids:
            vllm_mode = "keep"
        await self._post("pause", {"options": {"mode": vllm_mode, "clear_cache": True}})

    async def resume(self) -> None:
        await self._post("resume", {"options": {}})

    async def load(self, path: str) -> dict[str, Any]:
        answer = await self._post(
            "collective_rpc",
            {"method": RELOAD_METHOD, "kwargs": {"weights_path": path}},
        )
        results = (answer or {}).get("results") or []
        if not results:
            raise WeightUpdateError(f"{RELOAD_METHOD} reached no vLLM replica of '{self.model}'")
        workers = [w for r in results for w in r.get("worker_results") or []]
        return {"backend": "vllm", "path": path, "replicas": len(results), "workers": len(workers)}


VLLM = PolicyKind(
    "vllm",
    build_vllm_policy_app,
    lambda config, url, token: VllmWeights(
        url, config.policy.model, token, config.policy.prompt_mode == "token_ids"
    ),
    attaches=True,  # policy.base_url: an app already up, its control routes take the key
    settings_model=VllmSettings,
    interrupt=_interrupt_refusal,
)
