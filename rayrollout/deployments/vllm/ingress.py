"""The OpenAI ingress of Ray Serve LLM, with rayrollout's bearer-token check in front.

Ray 2.60's builders (``build_openai_app``, and ``build_dev_openai_app`` with the control
routes ``/pause``, ``/collective_rpc``, ...) make their FastAPI app inside, with no way to
add middleware, and Ray's token auth does not cover Serve's HTTP proxy. The control routes
pause the model and run methods in its workers, so they must not answer anyone who reaches
the port. This builds the same ingress deployment the builders do (same class, routes,
options and bound arguments) on an app that first passes ``rayrollout.auth``'s
``BearerTokenGate``; the ingress replica installs the run's ``RouteAuth`` when it starts.
One route more than Ray's: vLLM's token-in ``/inference/v1/generate`` (token ids with
images), served through ``token_route``'s model server, under the same check.

Imports of ``ray.llm`` stay inside the function: they need vLLM, which the default install
does not have.
"""

from __future__ import annotations

from typing import Any

from rayrollout.auth import BearerTokenGate, RouteAuth

__all__ = ["gated_openai_app"]


def gated_openai_app(
    llm_configs: list[Any],
    ingress_deployment_config: dict[str, Any],
    *,
    control_endpoints: bool,
    auth: RouteAuth,
) -> Any:
    """A ``serve.Application``: Ray Serve LLM's OpenAI ingress (``DevIngress`` with the control
    routes when ``control_endpoints``) over one LLM deployment per config, every route
    taking only the bearers ``auth`` accepts."""
    from ray import serve
    from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
    from ray.llm._internal.serve.core.ingress.dev_ingress import DEV_ENDPOINTS, DevIngress
    from ray.llm._internal.serve.core.ingress.ingress import (
        DEFAULT_ENDPOINTS,
        OpenAiIngress,
        init,
        make_fastapi_ingress,
    )
    from ray.llm._internal.serve.core.server.builder import build_llm_deployment

    from rayrollout.deployments.vllm.token_route import (
        TOKEN_ENDPOINTS,
        TokenIngressMixin,
        TokenServer,
    )

    base: Any = DevIngress if control_endpoints else OpenAiIngress
    endpoints = {**(DEV_ENDPOINTS if control_endpoints else DEFAULT_ENDPOINTS), **TOKEN_ENDPOINTS}

    class GatedIngress(TokenIngressMixin, base):
        """The ingress, installing the run's route check before it serves."""

        def __init__(self, *args: Any, route_auth: RouteAuth, **kwargs: Any) -> None:
            route_auth.install()
            super().__init__(*args, **kwargs)

    GatedIngress.__name__ = GatedIngress.__qualname__ = base.__name__  # Serve's names unchanged
    app = init()  # Ray's app with its own middleware (errors, CORS, metrics, request ids)
    app.add_middleware(BearerTokenGate)  # added last, so it runs first
    ingress_cls = make_fastapi_ingress(GatedIngress, endpoint_map=endpoints, app=app)
    options = maybe_apply_llm_deployment_config_defaults(
        base.get_deployment_options(llm_configs), ingress_deployment_config
    )
    return serve.deployment(ingress_cls, **options).bind(  # type: ignore[attr-defined]
        # Named as Ray names LLMServer's deployments ("LLMServer:<model>").
        llm_deployments={
            c.model_id: build_llm_deployment(
                c, deployment_cls=TokenServer, name_prefix="LLMServer:"
            )
            for c in llm_configs
        },
        model_cards={c.model_id: to_model_metadata(c.model_id, c) for c in llm_configs},
        lora_paths={
            c.model_id: c.lora_config.dynamic_lora_loading_path
            for c in llm_configs
            if c.lora_config is not None
        },
        route_auth=auth,
    )
