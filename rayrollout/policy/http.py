"""JSON over HTTP to the policy server, with the retries an OpenAI-protocol client makes.

The hot path skips the ``openai`` client, whose typed layers cost a worker over a third of
its CPU: one ``orjson`` encode, one aiohttp POST, one decode, with ``openai``'s retry rules
(408, 409, 429, 5xx, timeouts, ``retry-after``); each failed try can be reported (``failed``).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
import orjson

from rayrollout.policy.errors import HttpStatusError, HttpTimeout, HttpTransportError

__all__ = ["HttpStatusError", "HttpTimeout", "HttpTransportError", "PolicyHttp"]

_RETRIED_STATUSES = frozenset({408, 409, 429})


class PolicyHttp:
    """One connection pool to one base URL, shared by every episode of a worker."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_s: float,
        max_retries: int,
        max_connections: int,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_retries = max_retries
        self.max_connections = max_connections
        self.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: an aiohttp session belongs to the event loop it was made in.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self.headers, timeout=self.timeout
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def post(
        self,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        failed: list[str] | None = None,
    ) -> Any:
        """POST ``body`` as JSON, return the decoded JSON answer.

        Raises ``HttpStatusError``, ``HttpTimeout`` or ``HttpTransportError`` once retries
        are spent; an answer that is not JSON raises ``orjson.JSONDecodeError`` (a
        ``ValueError``) at once: the caller decides whether that is worth another try.
        Every failed try that was retried is appended to ``failed`` (briefly: what it got),
        so a call that succeeded on a later try can say so.
        """
        url = path if "://" in path else f"{self.base_url}{path}"  # or an absolute URL
        data = orjson.dumps(body)
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                async with self._client().post(url, data=data, headers=headers) as response:
                    raw = await response.read()
                    if response.status < 400:
                        return orjson.loads(raw)
                    error = HttpStatusError(response.status, _error_message(raw))
                    if last or not _retried(response.status):
                        raise error
                    delay = _retry_after_s(response.headers) or backoff_s(attempt)
                    what = f"HTTP {response.status}: {error.message}"
            except TimeoutError:
                if last:
                    raise HttpTimeout(url) from None
                delay, what = backoff_s(attempt), "timeout"
            except aiohttp.ClientError as exc:
                if last:
                    raise HttpTransportError(f"{type(exc).__name__}: {exc}") from exc
                delay, what = backoff_s(attempt), f"{type(exc).__name__}: {exc}"
            if failed is not None:
                failed.append(what)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")


def backoff_s(attempt: int) -> float:
    """Seconds before retry ``attempt + 1``: exponential from 0.25 s, capped, with jitter."""
    return min(8.0, 0.25 * 2**attempt) * random.uniform(0.75, 1.0)


def _retried(status: int) -> bool:
    return status in _RETRIED_STATUSES or status >= 500


def _retry_after_s(headers: Any) -> float | None:
    """The server's own wait (``retry-after-ms``, else ``retry-after`` in seconds), if sane."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
        if 0 < seconds <= 60:
            return seconds
    return None


def _error_message(raw: bytes) -> str:
    """The server's error text: OpenAI's ``{"error": {"message": ...}}`` or the body itself."""
    try:
        body = orjson.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip() or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    return raw.decode("utf-8", "replace")
