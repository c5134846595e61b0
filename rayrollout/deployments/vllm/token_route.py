"""vLLM's token-in route, ``POST /inference/v1/generate``, on Ray Serve LLM: token ids with images.

``/v1/completions`` takes a prompt of token ids but has no field for images, so a client that
keeps an episode's ids (``prompt_mode: token_ids``) cannot send the images they show there.
vLLM's token server takes both: ``token_ids`` (each image one placeholder token, as the chat
template renders it) with ``content_parts`` (the images, in order), expands the placeholders
with the model's processor and returns the expanded ``prompt_token_ids`` and where each image's
placeholders are (``mm_placeholders``). vLLM builds that server (``ServingTokens``) in every
replica, but Ray Serve LLM's ingress has no route to it. This module adds the route to the
ingress (``TokenIngressMixin``) and a method to the model's server (``TokenServer``) that hands
the request to the replica's ``ServingTokens``. The request and answer bodies are vLLM's own
(``GenerateRequest``, ``GenerateResponse``); streaming is not offered here. One check is added:
for a vision-language model, the image placeholder tokens in ``token_ids`` must be as many as
the images (vLLM expands every one it finds and checks no count, so an already expanded
prompt would silently be expanded again).

It imports ``ray.llm`` and vLLM at module level: import it only where vLLM is installed
(``ingress.gated_openai_app`` does, inside its builder).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray.llm._internal.serve.core.server.llm_server import LLMServer
from ray.serve._private.http_util import session_id_from_headers

__all__ = ["GENERATE_PATH", "TOKEN_ENDPOINTS", "TokenIngressMixin", "TokenServer"]

GENERATE_PATH = "/inference/v1/generate"  # vLLM's own path for it
# The ingress's extra route, in the form make_fastapi_ingress takes (method name -> route).
TOKEN_ENDPOINTS: dict[str, Callable[[FastAPI], Callable[..., Any]]] = {
    "generate_tokens": lambda app: app.post(GENERATE_PATH),
}


def _error(status: int, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message, "type": "BadRequestError", "code": status}}


class TokenServer(LLMServer):
    """Ray Serve LLM's model server with vLLM's token server reachable by a handle call."""

    async def generate_tokens(self, body: dict[str, Any]) -> AsyncIterator[tuple[int, dict]]:
        """One (HTTP status, body) pair: vLLM's ``GenerateResponse`` or its error. A
        generator because the ingress's model handles stream."""
        from pydantic import ValidationError
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

        if body.get("stream"):
            yield _error(400, f"{GENERATE_PATH} on Ray Serve does not stream: send stream=false")
            return
        try:
            request = GenerateRequest.model_validate(body)
        except ValidationError as exc:
            yield _error(400, f"invalid {GENERATE_PATH} request: {exc}")
            return
        problem = self._placeholder_problem(request)
        if problem:
            yield _error(400, problem)
            return
        engine: Any = self.engine  # Ray's VLLMEngine: vLLM's app state and engine client
        serving = getattr(engine._app_state, "serving_tokens", None)
        if serving is None:
            yield _error(501, f"this vLLM engine has no token server for {GENERATE_PATH}")
            return
        answer = await serving.serve_tokens(request)
        error = getattr(answer, "error", None)
        yield (error.code if error is not None else 200), answer.model_dump()

    def _placeholder_problem(self, request: Any) -> str | None:
        """Why ``request``'s image placeholders do not match its images, or None. vLLM
        expands every image token it finds and does not check the count: an already expanded
        prompt would be expanded again, and a placeholder without an image read as text."""
        if request.features is not None:  # rendered by vLLM's /render: already expanded
            return None
        engine: Any = self.engine
        hf_config = engine._engine_client.model_config.hf_config
        token = getattr(hf_config, "image_token_id", None)
        if token is None:
            token = getattr(hf_config, "image_token_index", None)
        if not isinstance(token, int):  # a text model
            return None
        placeholders = request.token_ids.count(token)
        parts = request.content_parts or []
        images = sum(1 for part in parts if part.get("type") == "image_url")
        if placeholders == images:
            return None
        return (
            f"token_ids hold {placeholders} image placeholder tokens (id {token}) but "
            f"content_parts {images} images: send one placeholder per image, not expanded, "
            "and every image of the conversation, in order"
        )


class TokenIngressMixin:
    """The ingress's ``generate_tokens`` route: the request to the model's ``TokenServer``
    replica (the session header kept, as the ingress's other routes keep it)."""

    async def generate_tokens(self, request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body, dict):
            status, answer = _error(400, f"{GENERATE_PATH} takes a JSON object")
            return JSONResponse(answer, status_code=status)
        model = body.get("model") or next(iter(self._model_cards))  # type: ignore[attr-defined]
        model_id = await self._get_model_id(model)  # type: ignore[attr-defined]
        handle = self._get_configured_serve_handle(model_id)  # type: ignore[attr-defined]
        session_id = session_id_from_headers(dict(request.headers))
        if session_id:
            handle = handle.options(session_id=session_id)
        async for status, answer in handle.generate_tokens.remote(body):
            return JSONResponse(answer, status_code=status)
        status, answer = _error(502, "the model server returned nothing")
        return JSONResponse(answer, status_code=status)
