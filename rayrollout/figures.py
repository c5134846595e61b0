"""The run figures the engine hands back and the light client reads: each model defined once.

``Figures`` is their base: typed, so a misspelt key fails where it is written, and readable
as a read-only mapping (``stats["mean_reward"]``, ``dict(stats)``), because training loops log
figures as dicts. ``EngineStats`` is ``stats()``'s answer, in the engine and over HTTP alike.

May import: nothing of rayrollout (the client, the writer and the engine all build on it).
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

__all__ = [
    "EngineStats",
    "EnvSummary",
    "Figures",
    "PolicyCalls",
    "PolicyState",
    "SamplingCounts",
    "WriterFigures",
]

_ANSWER = "rayrollout.figures.answer"
"""The validation context key of ``Figures.from_answer``."""


class Figures(BaseModel):
    """A pydantic model of figures that also reads like a dict.

    Iterating one yields ``(name, value)`` pairs, as pydantic's models do, not names.
    """

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def from_answer(cls, answer: Any) -> Any:
        """``answer`` (a service's JSON) as this model, leaving out figures a newer service
        adds at any depth, so a client keeps working against it."""
        return cls.model_validate(answer, context={_ANSWER: True})

    @model_validator(mode="before")
    @classmethod
    def _answer_leaves_out_unknown_figures(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and info.context and info.context.get(_ANSWER):
            return {key: value for key, value in data.items() if key in cls.model_fields}
        return data

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(f"{type(self).__name__} has no figure {key!r}; it has {self.keys()}")
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in type(self).model_fields

    def get(self, key: str, default: Any = None) -> Any:
        """The figure ``key``, or ``default`` where the model has no such figure."""
        return getattr(self, key) if key in self else default

    def keys(self) -> list[str]:
        """The figure names, in declaration order."""
        return list(type(self).model_fields)

    def values(self) -> list[Any]:
        """The figures, in declaration order."""
        return [getattr(self, name) for name in type(self).model_fields]

    def items(self) -> list[tuple[str, Any]]:
        """``(name, figure)`` pairs, in declaration order (``dict(figures)`` gives the same)."""
        return [(name, getattr(self, name)) for name in type(self).model_fields]


class WriterFigures(Figures):
    """What the writer has done so far (the summary table's caption, ``stats()["writer"]``)."""

    parts: int = Field(default=0, description="Parts renamed into place.")
    rows: int = Field(default=0, description="Rows in those parts.")
    buffered_rows: int = Field(default=0, description="Rows waiting for the next part.")
    seconds: float = Field(default=0.0, description="Seconds spent writing parts.")


class _Generated(Protocol):
    """What ``SamplingCounts.add`` reads of one ``generate`` result."""

    @property
    def groups(self) -> list[Any]: ...
    @property
    def groups_dropped(self) -> int: ...
    @property
    def extra_groups(self) -> int: ...
    @property
    def short_by(self) -> int: ...


class SamplingCounts(Figures):
    """Running totals over ``generate`` calls, for ``stats()``."""

    calls: int = 0
    episodes: int = 0
    groups_kept: int = 0
    groups_dropped: int = 0
    extra_groups: int = 0
    batches_short: int = 0

    def add(self, result: _Generated, episodes: int) -> None:
        """Count one ``generate`` call that ran ``episodes`` episodes."""
        self.calls += 1
        self.episodes += episodes
        self.groups_kept += len(result.groups)
        self.groups_dropped += result.groups_dropped
        self.extra_groups += result.extra_groups
        self.batches_short += result.short_by > 0


class EnvSummary(Figures):
    """One environment's figures in ``stats()``: means and percentiles, not raw counters."""

    episodes: int
    mean_reward: float
    errors: int = Field(description="Episodes whose status is not ok.")
    close_errors: int = Field(description="Episodes whose environment session failed to close.")
    statuses: dict[str, int]
    turns_per_episode: float
    p50_s: float = Field(description="Median episode seconds (of a bounded sample).")
    p95_s: float
    time_split: dict[str, float] = Field(description="Share of episode time per part.")
    mean_queued_s: float = Field(description="Mean seconds queued before the start.")


class PolicyState(Figures):
    """The policy's version and pause state (``WeightSync``)."""

    version: int
    paused: bool
    pause_mode: str
    updates: int = Field(description="Weight updates done.")
    last_update: dict[str, Any] = Field(description="What the last update reported.")


class PolicyCalls(Figures):
    """Model calls summed over every worker's gate."""

    in_flight: int = 0
    calls: int = 0
    held: int = Field(default=0, description="Calls that waited for a resume.")
    aborted: int = Field(default=0, description="Calls aborted by a pause and sent again.")
    stale_restarts: int = Field(default=0, description="Episodes restarted past max_staleness.")
    interrupted: int = Field(
        default=0, description="Calls a pause stopped, their tokens kept and continued."
    )
    kept_tokens: int = Field(default=0, description="Tokens those calls had when stopped.")
    discarded_tokens: int = Field(
        default=0,
        description="Tokens of stopped calls generated again (a constrained call that "
        "cannot resume its constraint).",
    )


class EngineStats(Figures):
    """``stats()``: what a training loop logs each step (``EngineActor.stats``, and
    ``GET /v1/stats`` of the rollout service)."""

    episodes_done: int
    episodes_in_flight: int
    episodes_per_s: float
    elapsed_s: float
    mean_reward: float
    errors: int
    close_errors: int
    statuses: dict[str, int]
    time_split: dict[str, float]
    mean_queued_s: float
    by_env: dict[str, EnvSummary]
    queued: int
    rows_written: int
    writer: WriterFigures
    policy: PolicyState
    dynamic_sampling: SamplingCounts
    policy_calls: PolicyCalls | None = Field(
        default=None, description="None from ``stats_snapshot``, which asks no worker."
    )
