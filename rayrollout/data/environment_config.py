"""Per-environment settings of a run (``RunConfig.environments``): class, args, hosting.

Apart from ``config`` because an environment's settings are a contract of their own, read
by the registry (class and ``args``), the hosting code (replicas, autoscaling, idle
sessions) and the NeMo Gym client (``url``); ``config`` re-exports them. Unknown keys are
errors (``extra="forbid"``), as everywhere in the config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rayrollout.data.config_model import ConfigModel

__all__ = ["DEFAULT_SESSION_IDLE_TIMEOUT_S", "EnvironmentAutoscaling", "EnvironmentConfig"]

# Serve-hosted stateful environments release a session with no call for this long.
DEFAULT_SESSION_IDLE_TIMEOUT_S = 3600.0


class EnvironmentAutoscaling(ConfigModel):
    """Bounds of an environment's replica count, scaled by Serve with the requests in flight."""

    min_replicas: int = Field(default=1, ge=0, description="Replicas at least.")
    max_replicas: int = Field(default=4, ge=1, description="Replicas at most.")
    target_ongoing_requests: float = Field(
        default=8.0, gt=0, description="Requests in flight per replica that Serve aims for."
    )
    upscale_delay_s: float = Field(
        default=2.0, ge=0, description="Load must stay high this long before scaling up."
    )
    downscale_delay_s: float = Field(
        default=30.0, ge=0, description="Load must stay low this long before scaling down."
    )
    max_ongoing_requests: int = Field(
        default=64,
        ge=1,
        description="Requests one replica takes at once; further calls wait in the caller "
        "(backpressure), they do not fail.",
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> EnvironmentAutoscaling:
        if self.max_replicas < max(1, self.min_replicas):
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be at least min_replicas "
                f"({self.min_replicas}) and 1"
            )
        return self

    def serve_config(self) -> dict[str, Any]:
        """As Serve's ``autoscaling_config``."""
        return {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "metrics_interval_s": 0.5,
            "look_back_period_s": 2.0,
        }


class EnvironmentConfig(ConfigModel):
    """Per-environment settings: its class and arguments, where it is hosted, how many replicas.

    The key it sits under in ``environments`` is the environment's one name: tasks name it,
    and hosting, sessions and these settings are looked up by it (never by the class's own
    ``name`` attribute), so one class can run under two names with different ``args``.
    """

    path: str | None = Field(
        default=None,
        description="'module:Class' of the environment under this name: an unregistered one, "
        "or a registered class under a second name (with other args). A registered name may "
        "not point at another class.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the environment's constructor, after the task "
        "(Class(task, **args)), wherever it is built: in the worker, on Serve replicas, in "
        "`env serve` and `env test`. They must be picklable (they travel to replicas).",
    )
    hosting: Literal["inline", "serve"] | None = Field(
        default=None, description="Override the environment's default hosting mode."
    )
    replicas: int = Field(default=1, ge=1, description="Serve replicas (hosting 'serve').")
    num_cpus: float = Field(default=0.1, gt=0, description="CPUs reserved per Serve replica.")
    autoscaling: EnvironmentAutoscaling | None = Field(
        default=None,
        description="Scale replicas with episodes in flight (Serve autoscaling_config); "
        "replaces 'replicas' when set.",
    )
    session_idle_timeout_s: float = Field(
        default=DEFAULT_SESSION_IDLE_TIMEOUT_S,
        gt=0,
        description="Serve-hosted stateful environments: a session with no call for this long "
        "is closed and its state released (HTTP clients that never verify or close, episodes "
        "of a killed worker). A call in flight keeps its session.",
    )
    url: str | None = Field(
        default=None,
        description="Base URL of a running NeMo Gym resources server to use as this "
        "environment (POST /seed_session, /<tool>, /verify, /close_session); tools come from "
        "the task rows. Excludes 'path' and 'hosting'.",
    )
    token_file: str | None = Field(
        default=None,
        description="A file holding the bearer token the server at 'url' takes (sent as "
        "'Authorization: Bearer ...'): the file `rayrollout env serve` prints. Read by each "
        "worker when it first calls the server; the token itself is never in the config.",
    )
    protocol: Literal["resources_server", "gymnasium"] | None = Field(
        default=None,
        description="What the NeMo Gym server at 'url' speaks: 'resources_server' "
        "(/seed_session, tools, /verify) or 'gymnasium' (/reset, /step). Unset, collect reads "
        "it from the routes the server lists (GET /openapi.json) before the run. Rows of a "
        "'gymnasium' server that name no agent (no 'agent', no agent_ref, no --agent) play "
        "with the reset_step agent.",
    )
    timeout_s: float = Field(
        default=60.0, gt=0, description="Timeout of one HTTP call to 'url' (one attempt)."
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        description="Retries with backoff of a call to 'url' on connection errors, timeouts, "
        "429 and 5xx.",
    )

    @model_validator(mode="after")
    def _url_excludes_local_hosting(self) -> EnvironmentConfig:
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
            if self.path is not None or self.hosting is not None:
                raise ValueError(
                    "an environment with 'url' runs on that server: drop 'path' and 'hosting'"
                )
            if self.args:
                raise ValueError(
                    "an environment with 'url' is built by its server, which takes no 'args' "
                    "from here: drop 'args' (configure the server instead)"
                )
        elif self.protocol is not None:
            raise ValueError(
                "'protocol' says what the NeMo Gym server at 'url' speaks: set 'url' too, or "
                "drop 'protocol'"
            )
        return self
