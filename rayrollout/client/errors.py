"""What the HTTP client raises: one class per way a call to the rollout service fails.

Each joins rayrollout's tree under its boundary (``InputError``: what the caller sent;
``ClusterError``: the service side) and keeps a builtin base; one for an HTTP answer carries
its ``status``, ``detail`` and ``body``.
"""

from __future__ import annotations

from typing import Any

from rayrollout.errors import ClusterError, InputError

__all__ = [
    "BadRequestError",
    "BatchConflictError",
    "BatchNotFoundError",
    "EngineGoneError",
    "ServiceBusyError",
    "ServiceError",
    "UnauthorizedError",
]


class _Answer:
    """An error answer of the service: its status, message and JSON body (a mixin of the
    classes below, each of which joins the tree under its boundary)."""

    def __init__(self, status: int, detail: str, body: dict[str, Any] | None = None) -> None:
        # Next in the MRO is always the class's exception base, which takes the message.
        super().__init__(f"HTTP {status}: {detail}")  # type: ignore[call-arg]
        self.status, self.detail, self.body = status, detail, body or {}


class ServiceError(_Answer, ClusterError, RuntimeError):
    """The service failed the call (a 5xx, or a status without a class of its own)."""


class ServiceBusyError(ServiceError):
    """429: the service holds its limit of open batches: read or delete some first."""


class UnauthorizedError(_Answer, InputError, PermissionError):
    """401: no bearer token, or not the run's (`rayrollout status` names the token file)."""


class BadRequestError(_Answer, InputError, ValueError):
    """400: the request or a task row is wrong; ``errors`` lists each bad row with its index
    in the submitted list (``row``), its ``field`` and the ``message``."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self.body.get("errors") or [])


class BatchNotFoundError(_Answer, InputError, LookupError):
    """404: no batch of that id (never submitted, deleted, or the service restarted)."""


class BatchConflictError(_Answer, InputError, ValueError):
    """409: the batch id is taken by other tasks, or the cursor asks for rows already
    acknowledged (freed)."""


class EngineGoneError(ClusterError, ConnectionError):
    """No service answers at the URL after the client's retries, or the service's engine
    died: `rayrollout status` says what is up, `rayrollout up` starts it again."""


ERROR_BY_STATUS: dict[int, type[Exception]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    404: BatchNotFoundError,
    409: BatchConflictError,
    429: ServiceBusyError,
}
"""The class an error status raises (any other: ``ServiceError``; 503: ``EngineGoneError``)."""
