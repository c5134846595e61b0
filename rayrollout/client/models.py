"""The rollout service's wire format, shared by the service and the client: one owner.

Requests are strict (``extra="forbid"``), answers open (``extra="allow"``), so a client keeps
working against a newer service. A trajectory travels as its output row (``TrajectoryRow``).
Nothing here imports pyarrow or Ray: this module is half of the light client. ``stats()``'s
answer (``EngineStats``, ``PolicyState``) is the engine's own model, from ``rayrollout.figures``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from rayrollout.figures import EngineStats, PolicyState

__all__ = [
    "BATCH_ID_PATTERN",
    "MAX_VERSION",
    "AckRequest",
    "AggregateMetricsRequest",
    "BatchStatus",
    "DeleteAnswer",
    "EngineStats",
    "ErrorAnswer",
    "Limits",
    "NemoGymRunRequest",
    "PauseAnswer",
    "PauseRequest",
    "PolicyState",
    "RowError",
    "ServiceInfo",
    "StreamedTrajectory",
    "SubmitRequest",
    "TrajectoryRow",
    "Turn",
    "WeightsAnswer",
    "WeightsRequest",
]

BATCH_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
"""Batch ids: URL-safe, at most 128 characters (the client makes a UUID)."""
MAX_VERSION = 2**53
"""The highest policy version: every JSON reader (JavaScript's too) keeps it exact."""

PauseMode = Literal["wait", "abort_and_retry", "continue", "interrupt"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class SubmitRequest(_Request):
    """``POST /v1/batches``: task rows to run ``n`` times each."""

    batch_id: str = Field(
        pattern=BATCH_ID_PATTERN,
        description="Chosen by the client and sent again on a retry: a submit whose batch id "
        "the service holds adds nothing (the answer says created=false).",
    )
    tasks: list[dict[str, Any]] = Field(
        min_length=1,
        description="Task rows as in a tasks file: rayrollout's ({prompt, environment?, "
        "agent?, sampling?, task_id?, ...verifier fields}) or NeMo Gym's.",
    )
    n: int = Field(default=1, ge=1, description="Samples per task (a GRPO group).")
    write: bool | None = Field(
        default=None,
        description="Also write the rows to the run's output folder (default: the config's "
        "training.write_trajectories); sample indices then continue past those on disk.",
    )
    skip_invalid: bool = Field(
        default=False,
        description="Run the valid rows and list the bad ones in the answer's 'rejected' "
        "(default: any bad row refuses the whole submit with 400, nothing started).",
    )
    resubmit: bool = Field(
        default=False,
        description="This client already streamed rows of the batch and sends it again to "
        "finish it (after an engine restart): a service that no longer knows the batch "
        "answers 404 and starts nothing, rather than running it anew under new samples.",
    )


class RowError(_Answer):
    """One task row the service refused."""

    row: int = Field(description="Index of the row in the submitted 'tasks' list (0-based).")
    task_id: str | None = None
    field: str | None = Field(default=None, description="The offending field, dotted.")
    message: str


class ErrorAnswer(_Answer):
    """Any refused call (4xx, 5xx): what is wrong and how to fix it, in ``detail``."""

    detail: str = Field(description="What was refused, the offending value, and the fix.")
    field: str | None = Field(default=None, description="The offending field, dotted.")
    errors: list[RowError] | None = Field(
        default=None, description="A refused submit: every bad row (index, field, message)."
    )


class Limits(_Answer):
    """The service's bounds (the config's ``service`` section)."""

    max_buffered_rows: int
    max_open_batches: int
    max_tasks_per_submit: int
    max_samples_per_task: int
    max_body_mb: float


class BatchStatus(_Answer):
    """A batch: what was submitted, how far it got, what the client acknowledged."""

    batch_id: str
    created: bool = Field(
        default=False, description="In a submit's answer: False when the batch id was known."
    )
    tasks: int
    n: int
    samples: int = Field(description="tasks x n: the rows the batch will stream.")
    finished: int = Field(description="Rows finished so far (cursors 0 .. finished-1).")
    acknowledged: int = Field(description="Cursor below which the client acknowledged rows.")
    running: int = Field(description="Samples sent to the engine and not finished.")
    done: bool = Field(description="Every sample finished.")
    error: str | None = Field(default=None, description="Why the batch cannot finish.")
    engine_gone: bool = Field(
        default=False,
        description="The engine died under the batch: a re-submit (same id, same tasks) "
        "finishes it once a new engine is up (`rayrollout up --resume`).",
    )
    rejected: list[RowError] = Field(default_factory=list)
    limits: Limits


class AckRequest(_Request):
    """``POST /v1/batches/{id}/ack``: the client holds every row below ``cursor``."""

    cursor: int = Field(
        ge=0,
        description="The cursor after the last row the client read (that row's cursor + 1); "
        "a cursor past the rows streamed so far is refused (409) and frees nothing.",
    )


class DeleteAnswer(_Answer):
    """``DELETE /v1/batches/{id}``: the batch is forgotten."""

    batch_id: str
    deleted: bool


class Turn(_Answer):
    """One model call of a trajectory (every field of the row's turn is kept)."""

    prompt_token_ids: list[int] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    forced: list[bool] = Field(default_factory=list, description="True on forced tokens.")
    model_logprobs: list[float] = Field(default_factory=list, description="Unconstrained.")
    policy_version: int = 0
    token_versions: list[int] = Field(
        default_factory=list, description="Policy version of each completion token."
    )
    speaker: str = "policy"
    extends_previous: bool = False
    finish_reason: str | None = None

    @model_validator(mode="after")
    def _versions_fill_from_policy_version(self) -> Turn:
        # A row written before token_versions: every token at the call's version.
        if not self.token_versions and self.completion_token_ids:
            self.token_versions = [self.policy_version] * len(self.completion_token_ids)
        return self


class TrajectoryRow(_Answer):
    """One finished episode as its output row (``Trajectory.to_row``)."""

    task_id: str
    sample_index: int
    group_id: str
    environment: str
    worker: str = Field(
        default="",
        # An older service's rows name the worker actor 'agent'.
        validation_alias=AliasChoices("worker", "agent"),
        description="The worker actor that played the episode, e.g. 'worker:0'.",
    )
    played_by: str = Field(default="", description="The agent (episode loop) that played it.")
    model: str = ""
    policy_version: int = 0
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: str = Field(default="[]", description="Tool schemas offered, as JSON text.")
    turns: list[Turn] = Field(default_factory=list)
    reward: float = 0.0
    verification: str = Field(default="{}", description="The verifier's details, JSON text.")
    status: str = "ok"
    error: str | None = None
    close_error: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    task_fields: str = Field(default="{}", description="The task's verifier fields, JSON text.")
    created_at: datetime | None = None

    @property
    def key(self) -> tuple[str, int]:
        """``(task_id, sample_index)``: what the service answers at most once per batch."""
        return (self.task_id, self.sample_index)

    def details(self) -> dict[str, Any]:
        """The verifier's details, decoded."""
        value = json.loads(self.verification or "{}")
        return value if isinstance(value, dict) else {}


class StreamedTrajectory(_Answer):
    """One line of a batch's stream: the row and its cursor (resume from ``cursor + 1``)."""

    cursor: int
    trajectory: TrajectoryRow


class PauseRequest(_Request):
    """``POST /v1/pause``: hold new model calls; those in flight per ``mode``."""

    mode: PauseMode | None = Field(
        default=None,
        description="Calls in flight: 'wait', 'abort_and_retry', 'continue' or 'interrupt'.",
    )


class PauseAnswer(_Answer):
    """What a pause held: the calls in flight and how long it took."""

    mode: str | None = None
    calls_in_flight: int = 0
    seconds: float = 0.0


class WeightsRequest(_Request):
    """``POST /v1/weights``: a checkpoint the engine can read, by absolute path."""

    path: str | None = Field(
        default=None,
        description="Safetensors folder: absolute, readable, and under one of the run's "
        "training.weights_roots (refused by name otherwise, before the policy pauses); "
        "None: only the version moves.",
    )
    version: int | None = Field(
        default=None,
        ge=0,
        le=MAX_VERSION,
        description="The new version, above the current one. Default: the current version + 1.",
    )
    request_id: str | None = Field(
        default=None,
        pattern=BATCH_ID_PATTERN,
        description="Sent again on a retry: an update the service already made answers again "
        "instead of moving the version twice.",
    )


class WeightsAnswer(_Answer):
    """The policy's version after the call (vLLM adds ``replicas`` and ``workers``)."""

    version: int


class ServiceInfo(_Answer):
    """``GET /v1/info``: the run behind the service."""

    namespace: str
    run_id: str | None = None
    output_dir: str
    output_format: str
    policy_version: int
    open_batches: int = Field(
        default=0, description="Batches with work left or rows unacknowledged."
    )
    limits: Limits


class NemoGymRunRequest(_Answer):
    """``POST /run``: a NeMo Gym task row (its other fields are the verifier's)."""

    responses_create_params: dict[str, Any] = Field(
        description="The Responses API request of the row: its 'input' is the prompt."
    )


class AggregateMetricsRequest(_Answer):
    """``POST /aggregate_metrics``: NeMo Gym's run figures of ``/run`` answers."""

    verify_responses: list[dict[str, Any]] = Field(description="The /run answers.")
