"""The channel to one OpenEnv environment instance: reset, step, close, and its action schema.

Behind ``OpenEnvChannel``, a WebSocket session on OpenEnv's server (``socket``) or the class
in this process (``inline``). ``OpenEnvError``: the environment failed (the episode ends
``error``); ``ActionRejected``: the model's action did not validate, and the model reads why.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from rayrollout.envkit.errors import ActionRejected, OpenEnvError

__all__ = ["ActionRejected", "OpenEnvChannel", "OpenEnvError", "Payload"]


class Payload(BaseModel):
    """One reset or step answer, as OpenEnv serializes an observation."""

    model_config = ConfigDict(extra="ignore")

    observation: dict[str, Any] = Field(default_factory=dict)
    reward: float | None = Field(default=None, allow_inf_nan=False)
    done: bool = False
    metadata: dict[str, Any] | None = None


class OpenEnvChannel(Protocol):
    """One episode's connection to one environment instance."""

    where: str  # how errors name it: "OpenEnv environment at ws://127.0.0.1:8000/ws"

    async def open(self) -> dict[str, Any]:
        """Open the session; answers the JSON schema of the environment's action class."""
        ...

    async def reset(self, data: dict[str, Any]) -> Payload: ...

    async def step(self, action: dict[str, Any]) -> Payload:
        """Step with the action as JSON; ``ActionRejected`` when it does not validate."""
        ...

    async def close(self) -> None:
        """Release the session (always called, failed episodes included)."""
        ...
