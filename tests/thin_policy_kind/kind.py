"""The ``thin`` policy kind: its settings, its server and its (fixed) weights."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from rayrollout import FixedWeights, OwnServer, PolicyKind, RunConfig, kind_settings
from rayrollout.auth import RouteAuth
from rayrollout.data.config import PolicyConfig
from rayrollout.ports import free_port


class ThinSettings(BaseModel):
    """The ``policy:`` keys the thin kind adds beside the common ones."""

    model_config = ConfigDict(extra="forbid")

    reply: str = Field(description="What the server answers to every model call.")
    served_model: str = Field(default="thin", description="The one model GET /v1/models lists.")

    @model_validator(mode="after")
    def _serves_the_model_asked_for(self, info: ValidationInfo) -> ThinSettings:
        """A check of the kind's own across its keys and the common ones: the run must ask
        for the model it serves."""
        policy: PolicyConfig | None = (info.context or {}).get("policy")
        if policy is not None and policy.model != self.served_model:
            raise ValueError(
                f"kind 'thin' serves model {self.served_model!r}, the config asks for "
                f"{policy.model!r}: set policy.model to it"
            )
        return self


def _handler(settings: ThinSettings, auth: RouteAuth) -> type[BaseHTTPRequestHandler]:
    numbers = count(1)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _allowed(self) -> bool:
            if auth.accepts(self.headers.get("Authorization")):
                return True
            self._answer(401, {"error": {"message": "a bearer token is required"}})
            return False

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self._allowed():
                model = {"id": settings.served_model, "object": "model", "owned_by": "thin"}
                self._answer(200, {"object": "list", "data": [model]})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self._allowed():
                return
            if not self.path.endswith("/chat/completions"):
                self._answer(404, {"error": {"message": f"no route {self.path}"}})
                return
            n = next(numbers)
            message = {"role": "assistant", "content": settings.reply}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            self._answer(
                200,
                {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", settings.served_model),
                    "choices": [choice],
                    "usage": usage,
                },
            )

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


def build_thin_server(config: RunConfig, auth: RouteAuth) -> OwnServer:
    """The kind's server on a free loopback port, started in the driver by the run."""
    settings = kind_settings(config, ThinSettings)
    port = free_port()

    def start() -> Callable[[], None]:
        server = ThreadingHTTPServer(("127.0.0.1", port), _handler(settings, auth))
        threading.Thread(target=server.serve_forever, daemon=True).start()

        def stop() -> None:
            server.shutdown()
            server.server_close()

        return stop

    return OwnServer(f"http://127.0.0.1:{port}/v1", start)


class ThinWeights(FixedWeights):
    """Nothing to load: the reply is the whole model."""

    async def load(self, path: str) -> dict[str, Any]:
        return {"backend": "thin", "path": path}


THIN = PolicyKind(
    "thin",
    build_thin_server,
    lambda config, url, token: ThinWeights(),
    settings_model=ThinSettings,
)
