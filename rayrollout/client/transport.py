"""HTTP for the client, on the standard library's ``http.client``: requests with retries, and
the line stream of a batch.

The standard library, so the client installs beside any trainer's pins on Python 3.10+. No
answer or a 502/503/504 is retried with backoff (state-changing calls carry idempotency
keys), then raises ``EngineGoneError``; any other error status raises its class.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from typing import Any

from rayrollout.client.errors import ERROR_BY_STATUS, EngineGoneError, ServiceError

__all__ = ["RETRYABLE_STATUS", "Transport", "raise_for_status"]

RETRYABLE_STATUS = frozenset({502, 503, 504})
# What a dropped or refused connection raises: OSError (refused, reset, timed out) and
# http.client's own (RemoteDisconnected, IncompleteRead, BadStatusLine).
CONNECTION_ERRORS = (OSError, http.client.HTTPException)


def raise_for_status(status: int, body: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx answer; else the error class for ``status`` is raised."""
    try:
        answer = json.loads(body) if body.strip() else {}
    except ValueError:
        answer = {"detail": body[:500].decode("utf-8", errors="replace")}
    if not isinstance(answer, dict):
        answer = {"value": answer}
    if 200 <= status < 300:
        return answer
    detail = str(answer.get("detail") or answer)
    if status == 503:
        raise EngineGoneError(f"the rollout service answered 503: {detail}")
    raise ERROR_BY_STATUS.get(status, ServiceError)(status, detail, answer)


def _json_body(method: str, path: str, payload: Any) -> bytes:
    """``payload`` as strict JSON: inf and nan have no JSON form, and the service would refuse
    the whole body, so they are refused here, before anything is sent."""
    try:
        return json.dumps(payload, allow_nan=False).encode()
    except ValueError as exc:
        raise ValueError(
            f"{method} {path}: the request holds a float JSON cannot carry (inf, -inf or nan): "
            "replace it with a finite number, a string or null"
        ) from exc


def _why_gone(cause: BaseException | str) -> str:
    """What the client can tell from how the service failed to answer."""
    text = str(cause)
    if "ConnectionRefused" in text:
        seen = "nothing listens at that address (the service's process, or its Ray, is down"
        seen += ", or Ray is restarting it)"
    elif "HTTP 50" in text:
        seen = "the service answers, but the engine behind it is down or restarting"
    else:
        seen = "the service did not answer in time (down, restarting, or unreachable)"
    return f"{seen}; `rayrollout status` on the cluster says what is up"


class Transport:
    """One service's address, token and retry rules."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout_s: float,
        retries: int,
        backoff_s: float,
    ) -> None:
        parts = urllib.parse.urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the service URL must be http(s)://host:port, got {url!r}")
        self.url = url.rstrip("/")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.prefix = parts.path
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def connection(self, timeout_s: float | None = None) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout_s or self.timeout_s)

    def pause(self, attempt: int) -> None:
        """Sleep before try ``attempt + 1``: doubling from ``backoff_s``, at most 5 s."""
        time.sleep(min(5.0, self.backoff_s * 2**attempt))

    def gone(self, tries: int, cause: BaseException | str) -> EngineGoneError:
        return EngineGoneError(
            f"no rollout service answered at {self.url} after {tries} tries ({cause}): "
            + _why_gone(cause)
        )

    def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Send one request (again on connection loss or 502-504); its JSON answer."""
        body = None if payload is None else _json_body(method, path, payload)
        last: BaseException | str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.pause(attempt - 1)
            connection = self.connection(timeout_s)
            try:
                connection.request(method, self.prefix + path, body=body, headers=self.headers)
                response = connection.getresponse()
                data = response.read()
            except CONNECTION_ERRORS as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            finally:
                connection.close()
            if response.status in RETRYABLE_STATUS and attempt < self.retries:
                last = f"HTTP {response.status}"
                continue
            return raise_for_status(response.status, data)
        raise self.gone(self.retries + 1, last)

    def open_stream(
        self, path: str, timeout_s: float
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A GET whose answer is read line by line; raises for an error status (the caller
        retries connection errors, knowing where its stream stands)."""
        connection = self.connection(timeout_s)
        try:
            headers = {**self.headers, "Accept": "application/x-ndjson"}
            connection.request("GET", self.prefix + path, headers=headers)
            response = connection.getresponse()
            if response.status != 200:
                raise_for_status(response.status, response.read())
        except BaseException:
            connection.close()
            raise
        return connection, response
