"""The ``service`` section of the run config: the rollout API over HTTP that ``rayrollout up``
starts beside its detached engine (``rayrollout.api.service``).

Its limits bound the service's memory whatever its clients do: a client that stops reading
stalls its own batch at the first limit, and the engine buffers no more for it.
"""

from __future__ import annotations

from pydantic import Field

from rayrollout.data.config_model import ConfigModel

__all__ = ["ServiceConfig"]


class ServiceConfig(ConfigModel):
    """The HTTP rollout API of ``rayrollout up`` (docs/how-to/service.md)."""

    enabled: bool = Field(default=True, description="Start the HTTP service with `rayrollout up`.")
    host: str = Field(
        default="127.0.0.1",
        description="Bind address. Loopback by default: name another (0.0.0.0) only on a "
        "network you trust; every route still wants the run's bearer token.",
    )
    port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="HTTP port; 0 (the default) picks a free one, which `rayrollout status` "
        "prints: two namespaces on one host never collide. Fix one for a firewall.",
    )
    max_buffered_rows: int = Field(
        default=2048,
        ge=1,
        description="Trajectories of one batch running or finished but not yet acknowledged "
        "by a client, at most; past it the batch waits for the client's acknowledgement "
        "(backpressure). Above the run's concurrency, or one batch cannot fill the engine.",
    )
    max_open_batches: int = Field(
        default=64,
        ge=1,
        description="Batches with work left or rows unacknowledged, at most; a submit past "
        "it answers 429.",
    )
    max_tasks_per_submit: int = Field(
        default=100_000, ge=1, description="Task rows in one submit, at most."
    )
    max_samples_per_task: int = Field(
        default=1024, ge=1, description="Samples per task (n) in one submit, at most."
    )
    max_body_mb: float = Field(default=256.0, gt=0, description="Largest request body, in MiB.")
    retain_s: float = Field(
        default=3600.0,
        ge=0,
        description="How long a batch whose rows were all acknowledged is remembered, so a "
        "submit retried with its batch id still adds nothing.",
    )
    nemo_gym_environment: str | None = Field(
        default=None,
        description="Environment of NeMo Gym rows posted to /run (they name none); default: "
        "the run's `environment`.",
    )
    nemo_gym_run_without_token: bool = Field(
        default=False,
        description="Answer /run and /aggregate_metrics without a bearer token, as NeMo "
        "Gym's own tools send none (every other route still wants it). Only on a host whose "
        "users you trust.",
    )
