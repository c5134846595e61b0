"""Policy weight versions on the engine side: pause and resume every worker, load new weights.

``WeightSync`` is the engine's half of ``policy_gate``: it closes and opens the gate of every
worker, keeps the version, and hands new weights to the policy kind's ``WeightBackend``
(``rayrollout.policy.kinds``; each lives with its deployment):

- ``vllm`` (Ray Serve LLM): over the app's control endpoints: pause, a
  ``collective_rpc`` that reloads the checkpoint in every vLLM worker, resume
  (``rayrollout.deployments.vllm.kind``); the same for an app already up that the run
  attaches to (``policy.base_url``).
- ``scripted``: a test double for the model's judgement; a new version changes nothing but
  the version every turn records.
- ``openai`` (an external server): it cannot be given a checkpoint; a trainer that updates
  the server itself calls ``update_weights(version=...)`` so turns record the new version.

A checkpoint path is checked before anything pauses (``checked_weights_path``): absolute,
resolved (symlinks and ``..``) under one of the run's ``training.weights_roots`` (by default
the output folder and the system temp folder), existing and readable by the engine's
process; otherwise ``WeightsPathError`` names the path and the rule, and the version stays.

``WeightUpdateError`` is re-exported here, where training loops have always caught it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from rayrollout.client.models import MAX_VERSION
from rayrollout.data.config import PAUSE_MODES, PauseMode, RunConfig
from rayrollout.engine.errors import WeightsPathError
from rayrollout.policy.kinds import (
    WeightBackend,
    WeightUpdateError,
    continue_refusal,
    interrupt_refusal,
    policy_kind,
)

__all__ = [
    "WeightSync",
    "WeightUpdateError",
    "WeightsPathError",
    "checked_weights_path",
    "weights_roots",
]


_SETTLE_S = 1.0  # how long a pause("interrupt") waits for stopped calls before stopping again
_SETTLE_TRIES = 120


def weights_roots(config: RunConfig) -> list[Path]:
    """The folders checkpoints may lie under, resolved: the config's ``weights_roots``, or
    the run's output folder and the system temp folder."""
    roots = config.training.weights_roots
    if roots is None:
        roots = [config.output.dir, tempfile.gettempdir()]
    return [Path(os.path.realpath(root)) for root in roots]


def checked_weights_path(path: str, config: RunConfig) -> str:
    """``path`` resolved, once it is absolute, under an allowed root, existing and readable.

    Raises:
        WeightsPathError: the path, and which rule it breaks.
    """
    if not Path(path).is_absolute():
        raise WeightsPathError(
            f"weights path must be absolute (the policy replicas read it from their own "
            f"processes and nodes): got {path!r}"
        )
    resolved = Path(os.path.realpath(path))
    roots = weights_roots(config)
    if not any(resolved.is_relative_to(root) for root in roots):
        shown = f"{path!r}" + (f" (resolved: {str(resolved)!r})" if str(resolved) != path else "")
        raise WeightsPathError(
            f"weights path {shown} is outside the folders this run loads checkpoints from "
            f"({', '.join(str(r) for r in roots)}): save the checkpoint under one of them, or "
            "add its folder to the config's training.weights_roots"
        )
    if not resolved.exists():
        raise WeightsPathError(
            f"weights path {path!r} does not exist on the engine's node: save the checkpoint "
            "first, on storage the engine and the policy replicas both see"
        )
    wanted = os.R_OK | (os.X_OK if resolved.is_dir() else 0)
    if not os.access(resolved, wanted):
        raise WeightsPathError(
            f"weights path {path!r} is not readable by the engine's process (user "
            f"{os.getuid()}): give it read permission"
        )
    return str(resolved)


class WeightSync:
    """The version, the paused state and the workers' gates, kept together by the engine."""

    def __init__(
        self, config: RunConfig, policy_url: str, workers: list[Any], policy_key: str | None
    ) -> None:
        self.config = config
        self.workers = workers
        # What the policy's routes take, as the workers send it (secret_env.workers_policy_key):
        # the run's token for a policy the run deployed, else the policy key (a vLLM app
        # already up takes it on its control routes too).
        kind = self.kind = policy_kind(config.policy.kind)
        self.backend: WeightBackend = kind.weight_backend(config, policy_url, policy_key)
        self.version = 0
        self.paused = False
        self.settle_at_resume = False  # a 'continue' pause whose server stopped the calls
        self.lock = asyncio.Lock()
        self.updates = 0
        self.last_update: dict[str, Any] = {}

    def state(self) -> tuple[int, bool]:
        """(version, paused), sent with every chunk so a restarted worker catches up."""
        return self.version, self.paused

    async def pause(self, mode: PauseMode | None = None) -> dict[str, Any]:
        """Hold new model calls on every worker; in-flight ones per ``mode`` (see policy_gate)."""
        mode = mode or self.config.training.pause_mode
        if mode not in PAUSE_MODES:
            raise ValueError(f"unknown pause mode {mode!r}: use one of {', '.join(PAUSE_MODES)}")
        if mode == "interrupt":
            refusal = interrupt_refusal(self.kind, self.config)
            if refusal is not None:
                raise ValueError(f"pause mode 'interrupt' refused: {refusal}")
        if mode == "continue":
            refusal = continue_refusal(self.kind, self.config)
            if refusal is not None:
                raise ValueError(f"pause mode 'continue' refused: {refusal}")
        async with self.lock:
            return await self._pause(mode)

    async def _pause(self, mode: PauseMode) -> dict[str, Any]:
        started = time.monotonic()
        if self.paused:
            return {"mode": mode, "calls_in_flight": 0, "seconds": 0.0, "already_paused": True}
        self.paused = True  # chunks dispatched from now on tell their worker so
        # A worker that is restarting misses the call; its next chunk carries the state.
        answers = await asyncio.gather(
            *(worker.pause.remote(mode) for worker in self.workers), return_exceptions=True
        )
        try:
            await self.backend.pause(mode)
        except BaseException:
            await self._resume()
            raise
        if mode == "interrupt":
            try:
                await self._settle(mode)
            except BaseException:
                await self._resume()
                raise
        # 'continue' returns at once; where the server stopped the calls (vLLM, token ids),
        # resume() settles them first, so none the server still holds runs under a label
        # it was not generated with.
        self.settle_at_resume = mode == "continue" and (
            interrupt_refusal(self.kind, self.config) is None
        )
        return {
            "mode": mode,
            "calls_in_flight": sum(n for n in answers if isinstance(n, int)),
            "seconds": time.monotonic() - started,
        }

    async def _settle(self, mode: PauseMode) -> None:
        """Wait until the calls the server stopped are back at their gates, tokens kept. A
        call sent just before the gates closed may reach the server after it paused, where
        it waits for a resume: the server is told to stop its calls again until none is left
        (each such call has no token yet and goes out again after resume)."""
        for _ in range(_SETTLE_TRIES):
            answers = await asyncio.gather(
                *(worker.settle.remote(_SETTLE_S) for worker in self.workers),
                return_exceptions=True,
            )
            if all(answer is True for answer in answers if not isinstance(answer, Exception)):
                return
            await self.backend.pause(mode)
        raise WeightUpdateError(
            f"pause('{mode}'): model calls were still in flight after the policy server was "
            f"told {_SETTLE_TRIES} times to stop them; is it answering?"
        )

    async def resume(self) -> dict[str, Any]:
        """Let model calls go out again, under the current version."""
        async with self.lock:
            return await self._resume()

    async def _resume(self) -> dict[str, Any]:
        if self.paused:
            if self.settle_at_resume:
                self.settle_at_resume = False
                try:
                    await self._settle("continue")
                except WeightUpdateError:  # a server that never answers: resume regardless
                    pass
            await self.backend.resume()
        self.paused = False
        await asyncio.gather(
            *(worker.resume.remote(self.version) for worker in self.workers), return_exceptions=True
        )
        return {"version": self.version}

    async def update_weights(
        self, path: str | None = None, version: int | None = None
    ) -> dict[str, Any]:
        """Load ``path`` into the policy (if given) and move to ``version`` (default: +1).

        Pauses around the update when not paused already (then resumes); after an explicit
        ``pause()`` it stays paused until ``resume()``.

        Raises:
            WeightsPathError: ``path`` is relative, outside ``training.weights_roots``,
                missing or unreadable (checked before the policy pauses).
            ValueError: ``version`` does not grow.
        """
        new_version = self.version + 1 if version is None else version
        if new_version <= self.version:
            raise ValueError(
                f"version must grow: the policy is at version {self.version}, got {new_version}"
            )
        if new_version > MAX_VERSION:
            raise ValueError(f"version {new_version} is over the highest, 2**53 ({MAX_VERSION})")
        if path is not None:  # checked before anything pauses: a refusal changes nothing
            path = await asyncio.to_thread(checked_weights_path, path, self.config)
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
