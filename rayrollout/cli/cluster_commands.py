"""``rayrollout up``, ``status`` and ``down``: a namespace's detached engine, as JSON or
one line per thing removed; the work is ``rayrollout.api.cluster``'s.

``up`` without a cluster starts a local Ray head that stays up; ``status`` and ``down`` only
join one, and ``down`` ends that head once no run is left on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from rayrollout.cli.common import config_option, fail, overrides

if TYPE_CHECKING:  # the config (pydantic, the output folder's pyarrow) loads when a command runs
    from rayrollout.data.config import RunConfig

__all__ = ["down", "status", "up"]

ConfigFile = Annotated[Path | None, typer.Option("--config", help="YAML config.")]
# A flag left out takes the --config file's value, else the config's own default (spelled
# out so that --help loads no config; tests/test_cli_help.py checks them).
Namespace = Annotated[
    str | None,
    config_option("namespace", "rayrollout", "--namespace", help="Ray namespace."),
]
Address = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Ray cluster to join (none named: a local Ray head that stays up until "
        "`rayrollout down`).",
        show_default="RAY_ADDRESS, else --config's ray.address, else a local Ray",
    ),
]
Joined = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Ray cluster to look at (none named: the local Ray head `rayrollout up` "
        "started); none is ever started.",
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
        from rayrollout.engine.startup import ensure_ray

        ensure_ray(run_config)
    return run_config


def up(
    config: Annotated[Path, typer.Option("--config", help="YAML config of the run.")],
    namespace: Namespace = None,
    address: Address = None,
    service_host: Annotated[
        str | None,
        config_option(
            "service.host",
            "127.0.0.1",
            "--service-host",
            help="Bind address of the HTTP rollout service.",
        ),
    ] = None,
    service_port: Annotated[
        int | None,
        config_option("service.port", "0", "--service-port", help="Its port (0: any free)."),
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
    """Start the policy, the environments, a detached engine and the HTTP rollout service,
    and return once they answer; they stay up until `rayrollout down`. Collect then attaches
    to the engine, trainers without Ray reach it over HTTP.

    With no cluster named it starts a local Ray head that outlives the command. An `up`
    stopped during start-up is finished by running the same `up` again."""
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


def _emit(answer: dict[str, Any], code: int = 0) -> None:
    typer.echo(json.dumps(answer, indent=2, default=str))
    if code:
        raise typer.Exit(code)


def _attached(
    config: Path | None, namespace: str | None, address: str | None, report: Any
) -> tuple[RunConfig, str, str | None]:
    """Join the running cluster (never start one) and pick the namespace: the one named
    (``--namespace`` or the config's), else the one run that is up. Returns the config, the
    namespace and the address joined (None: no cluster is up; nothing was joined).
    ``report`` ends the command with a message and an exit code."""
    from rayrollout.api.cluster import running_namespaces
    from rayrollout.engine.startup import attach_ray

    run_config = _cluster_config(config, namespace, address, join=False)
    try:
        joined = attach_ray(run_config)
    except (ConnectionError, RuntimeError) as exc:  # the address named does not answer
        report(
            f"the Ray cluster at {run_config.ray.address or 'RAY_ADDRESS'} does not "
            f"answer ({type(exc).__name__}: {exc})",
            1,
        )
    if joined is None or namespace is not None or config is not None:
        return run_config, run_config.namespace, joined
    running = running_namespaces()
    if len(running) > 1:
        report(f"several runs are up (namespaces {', '.join(running)}): pass --namespace", 2)
    return run_config, running[0] if running else run_config.namespace, joined


def status(config: ConfigFile = None, namespace: Namespace = None, address: Joined = None) -> None:
    """Print, as JSON, what is up in the namespace: the Ray cluster, the HTTP service, the
    engine's progress, Serve apps with replicas per node, workers. It joins the running
    cluster and never starts one: with none up it says so and exits 1. With neither
    --namespace nor --config it reports the one run that is up."""
    from rayrollout.api.cluster import status as cluster_status
    from rayrollout.engine.local_head import find_head, state_summary

    def report(message: str, code: int) -> NoReturn:
        _emit({"ray": {"up": False} if code == 1 else {"up": True}, "error": message}, code)
        raise typer.Exit(code)  # unreachable: _emit exits

    run_config, name, joined = _attached(config, namespace, address, report)
    if joined is None:
        _emit(
            {
                "namespace": run_config.namespace,
                "ray": {"up": False},
                "error": "no Ray cluster is up: `rayrollout up --config FILE` starts one with "
                "the run, or name one with --address or RAY_ADDRESS",
            },
            1,
        )
    head = find_head()
    local = state_summary(head if head is not None and head.address == joined else None)
    _emit({"ray": {"up": True, "address": joined, **local}, **cluster_status(name)})


def down(config: ConfigFile = None, namespace: Namespace = None, address: Joined = None) -> None:
    """Remove the namespace's engine, HTTP service, workers, policy and environment apps;
    then the local Ray `up` started, once no run is left on it. It never starts a Ray."""
    import ray

    from rayrollout.api.cluster import down as cluster_down
    from rayrollout.api.cluster import running_namespaces
    from rayrollout.engine.local_head import find_head, stop_head

    def report(message: str, code: int) -> NoReturn:
        fail(message, code)

    _, name, joined = _attached(config, namespace, address, report)
    if joined is None:
        typer.echo("nothing to remove: no Ray cluster is up")
        return
    for item in cluster_down(name):
        typer.echo(f"removed {item}")
    head = find_head()
    if head is not None and head.address == joined and not running_namespaces():
        ray.shutdown()
        stop_head(head)
        typer.echo(f"removed local Ray head (pid {head.pid}, {head.address})")
