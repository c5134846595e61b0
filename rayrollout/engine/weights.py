"""Policy weight versions on the engine side: pause and resume every agent, load new weights.

``WeightSync`` is the engine's half of ``policy_gate``: it closes and opens the gate of every
agent, keeps the version, and hands new weights to the policy backend:

- ``vllm`` (Ray Serve LLM): over the app's control endpoints (Ray's ``DevIngress``, deployed
  with ``control_endpoints: true``): ``POST /pause`` (vLLM's ``pause_generation`` on every
  replica, KV and prefix caches cleared), ``POST /collective_rpc`` of
  ``rayrollout_reload_weights(weights_path=...)`` (every worker of every replica reloads the
  checkpoint in place; ``rayrollout.deployments.vllm.worker``), ``POST /resume``.
- ``scripted``: a test double for the model's judgement; a new version changes nothing but
  the version every turn records.
- ``openai`` (an external server): it cannot be given a checkpoint; a trainer that updates
  the server itself calls ``update_weights(version=...)`` so turns record the new version.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from rayrollout.data.config import RunConfig
from rayrollout.deployments.vllm.worker import RELOAD_METHOD
from rayrollout.policy.gate import PAUSE_MODES, PauseMode

__all__ = ["WeightSync", "WeightUpdateError"]

# vLLM's pause_generation mode per rayrollout pause mode: agents have already finished
# ('wait') or cancelled ('abort_and_retry') their calls; 'continue' freezes the calls left
# in flight and lets them go on after resume.
_VLLM_PAUSE = {"wait": "keep", "abort_and_retry": "abort", "continue": "keep"}
_CONTROL_TIMEOUT_S = 600.0


class WeightUpdateError(RuntimeError):
    """The policy backend could not pause, resume or load weights."""


class _Backend:
    """What the policy needs around a weight update; the scripted policy needs nothing."""

    async def pause(self, mode: PauseMode) -> None:
        return None

    async def resume(self) -> None:
        return None

    async def load(self, path: str) -> dict[str, Any]:
        return {"backend": "scripted", "path": path}


class _ExternalBackend(_Backend):
    async def load(self, path: str) -> dict[str, Any]:
        raise WeightUpdateError(
            "policy kind 'openai' is an external server rayrollout cannot load weights into: "
            "update it yourself, then call update_weights(version=N) without a path"
        )


class _VllmBackend(_Backend):
    """Ray Serve LLM's control endpoints (``DevIngress``), next to the app's ``/v1``."""

    def __init__(self, policy_url: str, model: str) -> None:
        self.base = policy_url.rstrip("/").removesuffix("/v1")
        self.model = model

    async def _post(self, route: str, body: dict[str, Any]) -> Any:
        url = f"{self.base}/{route}"
        timeout = aiohttp.ClientTimeout(total=_CONTROL_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            async with http.post(url, json={"model": self.model, **body}) as response:
                text = await response.text()
                if response.status == 404:
                    raise WeightUpdateError(
                        f"POST {url} answered 404: the vLLM app has no control endpoints; "
                        "deploy it with `control_endpoints: true` in its deployment file "
                        "(deployments/vllm/)"
                    )
                if response.status >= 400:
                    raise WeightUpdateError(
                        f"POST {url} answered HTTP {response.status}: {text[:500]}"
                    )
                return await response.json() if text else None

    async def pause(self, mode: PauseMode) -> None:
        await self._post("pause", {"options": {"mode": _VLLM_PAUSE[mode], "clear_cache": True}})

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


def _backend(config: RunConfig, policy_url: str) -> _Backend:
    if config.policy.kind == "vllm":
        return _VllmBackend(policy_url, config.policy.model)
    if config.policy.kind == "openai":
        return _ExternalBackend()
    return _Backend()


class WeightSync:
    """The version, the paused state and the agents' gates, kept together by the engine."""

    def __init__(self, config: RunConfig, policy_url: str, agents: list[Any]) -> None:
        self.config = config
        self.agents = agents
        self.backend = _backend(config, policy_url)
        self.version = 0
        self.paused = False
        self.lock = asyncio.Lock()
        self.updates = 0
        self.last_update: dict[str, Any] = {}

    def state(self) -> tuple[int, bool]:
        """(version, paused), sent with every chunk so a restarted agent catches up."""
        return self.version, self.paused

    async def pause(self, mode: PauseMode | None = None) -> dict[str, Any]:
        """Hold new model calls on every agent; in-flight ones per ``mode`` (see policy_gate)."""
        mode = mode or self.config.training.pause_mode
        if mode not in PAUSE_MODES:
            raise ValueError(f"unknown pause mode {mode!r}: use one of {', '.join(PAUSE_MODES)}")
        async with self.lock:
            return await self._pause(mode)

    async def _pause(self, mode: PauseMode) -> dict[str, Any]:
        started = time.monotonic()
        if self.paused:
            return {"mode": mode, "calls_in_flight": 0, "seconds": 0.0, "already_paused": True}
        self.paused = True  # chunks dispatched from now on tell their agent so
        # An agent that is restarting misses the call; its next chunk carries the state.
        answers = await asyncio.gather(
            *(agent.pause.remote(mode) for agent in self.agents), return_exceptions=True
        )
        try:
            await self.backend.pause(mode)
        except BaseException:
            await self._resume()
            raise
        return {
            "mode": mode,
            "calls_in_flight": sum(n for n in answers if isinstance(n, int)),
            "seconds": time.monotonic() - started,
        }

    async def resume(self) -> dict[str, Any]:
        """Let model calls go out again, under the current version."""
        async with self.lock:
            return await self._resume()

    async def _resume(self) -> dict[str, Any]:
        if self.paused:
            await self.backend.resume()
        self.paused = False
        await asyncio.gather(
            *(agent.resume.remote(self.version) for agent in self.agents), return_exceptions=True
        )
        return {"version": self.version}

    async def update_weights(
        self, path: str | None = None, version: int | None = None
    ) -> dict[str, Any]:
        """Load ``path`` into the policy (if given) and move to ``version`` (default: +1).

        Pauses around the update when not paused already (then resumes); after an explicit
        ``pause()`` it stays paused until ``resume()``.
        """
        new_version = self.version + 1 if version is None else version
        if new_version <= self.version:
            raise ValueError(
                f"version must grow: the policy is at version {self.version}, got {new_version}"
            )
        if path is not None and not Path(path).is_absolute():
            raise ValueError(
                f"weights path must be absolute (the policy replicas read it from their own "
                f"processes and nodes): got {path!r}"
            )
        async with self.lock:
            was_paused = self.paused
            if not was_paused:
                await self._pause(self.config.training.pause_mode)
            started = time.monotonic()
            try:
                loaded = await self.backend.load(path) if path is not None else {}
                self.version = new_version
                self.updates += 1
            finally:
                if not was_paused:
                    await self._resume()
            self.last_update = {
                "version": new_version,
                "seconds": time.monotonic() - started,
                **loaded,
            }
            return self.last_update

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "paused": self.paused,
            "pause_mode": self.config.training.pause_mode,
            "updates": self.updates,
            "last_update": self.last_update,
        }
