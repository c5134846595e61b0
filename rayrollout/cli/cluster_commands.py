"""``rayrollout up``, ``status`` and ``down``: long-lived services of a namespace, as JSON or
one line per thing removed. The work is ``rayrollout.api.cluster``'s. Both JSON answers name
the HTTP rollout service (``service``: its ``url`` and the ``token_file`` a client reads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rayrollout.cli.common import fail, overrides

if TYPE_CHECKING:  # the config (pydantic, the output folder's pyarrow) loads when a command runs
    from rayrollout.data.config import RunConfig

__all__ = ["down", "status", "up"]

ConfigFile = Annotated[Path | None, typer.Option("--config", help="YAML config.")]
# A flag left out takes the --config file's value, else the config's own default (spelled
# out so that --help loads no config; tests/test_cli_help.py checks them).
Namespace = Annotated[
    str | None,
    typer.Option(
        "--namespace", help="Ray namespace.", show_default="--config's namespace, else rayrollout"
    ),
]
Address = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Ray cluster to join.",
        show_default="RAY_ADDRESS, else --config's ray.address, else a local Ray",
    ),
]


def _cluster_config(
    config: Path | None,
    namespace: str | None,
    address: str | None,
    join: bool = True,
    **flags: object,
) -> RunConfig:
    """The config with the command's flags applied; ``join``: connected to its Ray cluster."""
    from rayrollout.data.config import load_config

    run_config = load_config(config, overrides(namespace=namespace, ray__address=address, **flags))
    if join:
        from rayrollout.engine.services import ensure_ray

        ensure_ray(run_config)
    return run_config


def up(
    config: Annotated[Path, typer.Option("--config", help="YAML config of the services.")],
    namespace: Namespace = None,
    address: Address = None,
    service_host: Annotated[
        str | None,
        typer.Option(
            "--service-host",
            help="Bind address of the HTTP rollout service.",
            show_default="--config's service.host, else 127.0.0.1",
        ),
    ] = None,
    service_port: Annotated[
        int | None,
        typer.Option(
            "--service-port",
            help="Its port (0: any free).",
            show_default="--config's service.port, else 0",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Start again after the engine (or the service too) died: keep the run's "
            "token, and answer a trainer re-submitting an unfinished batch with what was "
            "finished (journaled in the output folder). Without it, an output folder holding "
            "unfinished batches of a service now gone is refused.",
        ),
    ] = False,
) -> None:
    """Start the policy, the environments, a detached engine and the HTTP rollout service;
    collect then attaches to the engine, trainers without Ray reach it over HTTP."""
    from rayrollout.api.cluster import up as cluster_up

    run_config = _cluster_config(
        config,
        namespace,
        address,
        join=False,
        service__host=service_host,
        service__port=service_port,
        resume=resume,
    )
    try:
        state = cluster_up(run_config)
    except RuntimeError as exc:  # Serve failing to deploy (an existing engine is one too)
        fail(str(exc), 1)
    typer.echo(json.dumps(state, indent=2, default=str))


def status(config: ConfigFile = None, namespace: Namespace = None, address: Address = None) -> None:
    """List what is up in the namespace: Serve apps, replicas per node, workers, engine health."""
    from rayrollout.api.cluster import status as cluster_status

    run_config = _cluster_config(config, namespace, address)
    typer.echo(json.dumps(cluster_status(run_config.namespace), indent=2, default=str))


def down(config: ConfigFile = None, namespace: Namespace = None, address: Address = None) -> None:
    """Remove the namespace's engine, workers, policy and environment apps."""
    from rayrollout.api.cluster import down as cluster_down

    run_config = _cluster_config(config, namespace, address)
    for item in cluster_down(run_config.namespace):
        typer.echo(f"removed {item}")
