"""The light client of the rollout service: a trainer without Ray reaches a running engine
over HTTP (``rayrollout up`` starts the service; docs/how-to/service.md).

``RolloutClient`` (blocking, ``sync``) and ``AsyncRolloutClient`` (``aio``) offer the same
calls; ``models`` is the wire format the service shares with them; ``errors`` what a call
raises; ``transport`` the HTTP underneath (the standard library's ``http.client``).

Importing it loads neither Ray nor pyarrow nor vLLM (a test checks ``sys.modules``), and it
runs on Python 3.10-3.13 with pydantic alone, so it installs beside any trainer's pins:
``pip install rayrollout`` brings it with the engine, and ``clients/python`` builds
``rayrollout-client``, this package with nothing of the engine.

May import: ``rayrollout.errors``, ``rayrollout.auth`` (both standard library only) and
``rayrollout.figures`` (pydantic only), the standard library and pydantic; nothing else of
rayrollout (``rayrollout/__init__`` loads its names lazily, so importing this package runs
none of them).
"""

from __future__ import annotations

from rayrollout.client import errors
from rayrollout.client.aio import AsyncRolloutClient
from rayrollout.client.errors import *  # noqa: F403  # what a call raises: errors.__all__
from rayrollout.client.models import (
    BatchStatus,
    EngineStats,
    Limits,
    PauseAnswer,
    RowError,
    ServiceInfo,
    StreamedTrajectory,
    TrajectoryRow,
    Turn,
    WeightsAnswer,
)
from rayrollout.client.sync import RolloutClient

__all__ = [
    "AsyncRolloutClient",
    "BatchStatus",
    "EngineStats",
    "Limits",
    "PauseAnswer",
    "RolloutClient",
    "RowError",
    "ServiceInfo",
    "StreamedTrajectory",
    "TrajectoryRow",
    "Turn",
    "WeightsAnswer",
]
__all__ += errors.__all__
