"""Bearer tokens for rayrollout's HTTP routes: `env serve`, a run's Serve routes, vLLM control.

Every HTTP surface rayrollout opens runs code on request, so each answers only
``Authorization: Bearer <token>``. A run makes its token (``new_token``); replicas hold only
its SHA-256 (``RouteAuth``), checked by ASGI middleware (``BearerTokenGate``). An open route
is an explicit choice (``RouteAuth.open()``), never a default.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "AUTH_HEADER",
    "BearerTokenGate",
    "RouteAuth",
    "bearer_header",
    "new_token",
    "read_token_file",
    "token_digest",
    "write_token_file",
]

AUTH_HEADER = "authorization"


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """The SHA-256 hex digest replicas compare against: the token itself stays with the run."""
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_header(token: str) -> dict[str, str]:
    """The request header that carries ``token``."""
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class RouteAuth:
    """What a route accepts: requests bearing the token whose digest this holds, or (with
    ``digest`` None, only by an explicit ``RouteAuth.open()``) any request."""

    digest: str | None

    @classmethod
    def bearer(cls, token: str) -> RouteAuth:
        if not token:
            raise ValueError("an empty token would accept anyone: use RouteAuth.open() to say so")
        return cls(token_digest(token))

    @classmethod
    def open(cls) -> RouteAuth:
        """No token asked: the caller opted out (and should have said so to the user)."""
        return cls(None)

    @property
    def required(self) -> bool:
        return self.digest is not None

    def accepts(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value passes (constant-time comparison)."""
        if self.digest is None:
            return True
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return False
        return hmac.compare_digest(token_digest(presented.strip()), self.digest)

    def install(self) -> None:
        """Make this the process's route check (a Serve replica's constructor calls it)."""
        global _installed
        _installed = self


_installed: RouteAuth | None = None  # None: nothing installed yet, so nothing is let in


class BearerTokenGate:
    """ASGI middleware refusing HTTP requests whose bearer token the process's ``RouteAuth``
    does not accept (401, with a body saying what to send). Lifespan events pass."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        presented = headers.get(AUTH_HEADER.encode())
        auth = _installed
        if auth is not None and auth.accepts(presented.decode("latin-1") if presented else None):
            await self.app(scope, receive, send)
            return
        why = "no bearer token was sent" if presented is None else "the bearer token is wrong"
        body = json.dumps(
            {
                "detail": f"401 Unauthorized: {why}. rayrollout's routes take 'Authorization: "
                "Bearer <token>': the run's token (RolloutEngine.route_token, or the file "
                "`rayrollout collect` names), or the file `rayrollout env serve` printed"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b'Bearer realm="rayrollout"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def write_token_file(path: str | Path, token: str | None = None) -> str:
    """Write ``token`` (a new one if None) to ``path``, readable by its owner only (0600);
    returns the token. The folder is made (0700) when missing."""
    token = token or new_token()
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.chmod(temp, 0o600)
    os.replace(temp, target)
    return token


def read_token_file(path: str | Path) -> str:
    """The token a file holds (``write_token_file``'s format: one line)."""
    target = Path(path).expanduser()
    try:
        token = target.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the token file {target}: {exc.strerror}") from None
    if not token:
        raise ValueError(f"the token file {target} is empty")
    return token
