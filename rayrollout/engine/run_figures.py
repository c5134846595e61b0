"""What the engine hands back about a run: typed figures, one model per answer.

``EngineActor.progress``/``finish`` answer a ``RunSnapshot`` (the progress bar and summary
read it) and ``stats`` an ``EngineStats`` (what a training loop logs): as models, a misspelt
key fails where it is written, not at the end of a long run. Each also reads as a mapping
(``stats["mean_reward"]``, ``dict(stats)``). ``EngineStats`` and its parts are
defined in ``rayrollout.figures``, which the light client shares.
"""

from __future__ import annotations

from pydantic import Field

from rayrollout.engine.stats import EnvStats
from rayrollout.figures import Figures, WriterFigures

__all__ = ["RunSnapshot"]


class RunSnapshot(Figures):
    """The current batch's figures: ``progress()`` while it runs, ``finish()`` at its end."""

    elapsed_s: float = Field(description="Seconds since the engine (or this batch) began.")
    in_flight: int = Field(description="Episodes on workers now (running, or waiting there).")
    episodes_per_s: float = Field(description="Finished episodes per second of elapsed time.")
    total: EnvStats = Field(description="Counters over every environment.")
    by_env: dict[str, EnvStats] = Field(description="Counters per environment name.")
    queued: int = Field(default=0, description="Episode specs waiting in the engine's queue.")
    rows_written: int = Field(
        default=0, description="Rows in parts on disk (buffered rows not counted)."
    )
    writer: WriterFigures = Field(
        default_factory=WriterFigures, description="Parts, rows and seconds of the writer."
    )
    parts: list[str] = Field(
        default_factory=list, description="``finish`` only: the parts this batch wrote."
    )
    worker_messages: int = Field(
        default=0,
        description="Ray messages between the engine actor and its workers in this batch: "
        "calls that send episodes and their answers, sessions opened, reports back.",
    )
