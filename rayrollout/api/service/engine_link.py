"""The service's hold on the engine actor: found by name, and found again after it died.

A call that finds the actor gone drops the handle; the next looks the name up again (an
engine ``up --resume`` started anew), which is first told the sample indices journaled
batches hold. An engine's failure becomes its HTTP answer: 503 gone, 400 refused, else 500.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from rayrollout.api.service.journal import JournalState, open_journals
from rayrollout.data.config import RunConfig
from rayrollout.engine.engine_actor import ENGINE_NAME
from rayrollout.errors import InputError, RayrolloutError

__all__ = ["ENGINE_DOWN", "EngineLink", "HttpError", "engine_error"]

_RESTORE_SLICE = 256  # journaled rows per engine.restore_rows call
ENGINE_DOWN = (
    "the engine actor is gone and no new one is up: `rayrollout up --resume` (with the "
    "run's config) starts one, and a re-submit of a batch then finishes it"
)


class HttpError(RayrolloutError, RuntimeError):
    """A call the service refuses: its HTTP status and a JSON body with ``detail``."""

    def __init__(self, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.body = status, {"detail": detail, **extra}


def engine_error(exc: BaseException) -> HttpError:
    """An engine call's failure: its own refusal (400/500 with its message), or 503 gone."""
    if died(exc):
        return HttpError(
            503,
            f"the engine actor is gone ({type(exc).__name__}): `rayrollout up --resume` "
            "brings it back",
        )
    cause = exc.cause if isinstance(exc, RayTaskError) else exc
    status = 400 if isinstance(cause, ValueError | InputError) else 500
    return HttpError(status, f"{type(cause).__name__}: {cause}")


def died(exc: BaseException) -> bool:
    """Whether a call failed because its actor is gone (not because the call failed)."""
    return isinstance(exc, RayActorError | ActorUnavailableError)


class EngineLink:
    """The namespace's engine actor, as the service reaches it."""

    def __init__(self, config: RunConfig, engine: Any) -> None:
        self.config = config
        self.engine: Any = None  # set once claimed; None again once it died
        self.found: Any = engine  # the handle the service started with, not yet claimed
        self.finding = asyncio.Lock()  # one lookup (and claim) of an engine at a time

    async def current(self) -> Any:
        """The engine's handle; after it died, the namespace's new engine once one is up.
        Each engine, the first one too, claims the journaled batches' samples first.

        Raises:
            HttpError: 503, no engine is up in the namespace.
        """
        if self.engine is not None:
            return self.engine
        async with self.finding:
            if self.engine is None:
                engine, self.found = self.found, None
                if engine is None:
                    try:
                        engine = await asyncio.to_thread(
                            ray.get_actor, ENGINE_NAME, self.config.namespace
                        )
                    except ValueError:
                        raise HttpError(503, ENGINE_DOWN) from None
                try:
                    await engine.claim_samples.remote(await asyncio.to_thread(self._claims))
                except Exception as exc:
                    raise engine_error(exc) from None  # a dead one is looked up next time
                self.engine = engine
        return self.engine

    def _claims(self) -> dict[str, int]:
        """Per task id, the sample index past those the journaled writing batches hold."""
        ends: dict[str, int] = {}
        for meta in open_journals(self.config.output.dir):
            if meta.get("write"):
                for task_id, first in meta.get("first_index", {}).items():
                    ends[task_id] = max(ends.get(task_id, 0), first + int(meta["n"]))
        return ends

    def lost(self, engine: Any, exc: BaseException) -> None:
        """A call to ``engine`` failed: if the actor is gone, look for a new one next time."""
        if died(exc) and self.engine is engine:
            self.engine = None

    async def call(self, method: str, *args: Any) -> Any:
        """A call on the engine; on a handle found dead, once more on the namespace's new
        engine (a call that failed because its engine died was not made)."""
        for attempt in range(2):
            engine = await self.current()
            try:
                return await getattr(engine, method).remote(*args)
            except Exception as exc:
                self.lost(engine, exc)
                if attempt or not died(exc):
                    raise engine_error(exc) from None
        raise AssertionError("unreachable: the second try returns or raises")

    async def restore(self, state: JournalState) -> None:
        """The journaled rows the folder lacks (the dead engine had not yet written their
        part) go to the current engine's writer."""
        rows = await asyncio.to_thread(state.rows)
        for start in range(0, len(rows), _RESTORE_SLICE):
            await self.call("restore_rows", rows[start : start + _RESTORE_SLICE])
