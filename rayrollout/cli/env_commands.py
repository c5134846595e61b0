"""``rayrollout env list|test|serve|nemo-gym-config|tasks``: one environment at a time, by
its registered name or a ``module:Class`` path; an unknown name is an input error (exit 2).

``test`` runs its verifier cases and tool tests (``rayrollout.envkit.testing``),
``serve`` puts it behind NeMo Gym's resources-server HTTP protocol on Ray Serve.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from rayrollout.cli.common import console, fail
from rayrollout.data.environment_config import DEFAULT_SESSION_IDLE_TIMEOUT_S

# The registry and the run config load in the command that needs them, not at import: they
# bring pyarrow (the output folder) with them, and `--help` should cost nothing.

# env test / env serve build the environment as a run would: its config entry's path and args.
ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", help="Run config whose environments.NAME (path, args) builds it."),
]

__all__ = ["env_app"]

env_app = typer.Typer(no_args_is_help=True, help="Inspect registered environments.")


@env_app.command("list")
def env_list() -> None:
    """List registered environments with their source, hosting mode and tools."""
    from rich.table import Table

    from rayrollout.envkit.registry import (
        UnknownEnvironmentError,
        available_environments,
        load_environment,
    )

    table = Table(title="environments")
    for column in ("name", "source", "class", "hosting", "tools"):
        table.add_column(column)
    for name, path in sorted(available_environments().items()):
        try:
            cls = load_environment(name)
            tools = ", ".join(t["function"]["name"] for t in cls.tool_schemas())
            # The library an environment comes from (skyrl-gym, GEM, OpenEnv), else the
            # package that defines it.
            source = getattr(cls, "source", "") or cls.__module__.split(".")[0]
            table.add_row(name, source, path, cls.default_hosting, tools)
        except UnknownEnvironmentError as exc:
            table.add_row(name, "-", path, "-", f"[red]{exc}")
    Console().print(table)


@env_app.command("test")
def env_test(
    name: Annotated[str, typer.Argument(help="Registered environment name or 'module:Class'.")],
    cases: Annotated[
        Path | None,
        typer.Option(
            "--cases",
            help="Verifier cases file.",
            show_default="verifier_cases.jsonl in the environment's folder",
        ),
    ] = None,
    cases_only: Annotated[
        bool, typer.Option("--cases-only", help="Skip the tool tests (the folder's tests/).")
    ] = False,
    select: Annotated[
        str | None, typer.Option("-k", help="Run only the tool tests matching this expression.")
    ] = None,
    config_file: ConfigFile = None,
) -> None:
    """Run an environment's verifier cases, then its tool tests; non-zero naming any failure."""
    import asyncio

    from rich.table import Table

    from rayrollout.envkit.registry import configured_environment
    from rayrollout.envkit.testing import (
        CASES_FILE,
        environment_folder,
        missing_test_packages,
        read_cases,
        run_case,
        run_tool_tests,
        tool_tests_folder,
    )

    spec = configured_environment(name, config_file)
    env_cls = spec.load()
    unavailable = env_cls.unavailable_reason()  # one line, not a failed case per case
    if unavailable is not None:
        fail(f"environment '{name}' cannot run on this machine: {unavailable}", 1)
    path = cases or environment_folder(env_cls) / CASES_FILE
    if not path.exists():
        fail(
            f"no verifier cases for '{name}': write {path} (one JSON case a line: name, task, "
            "messages, final_answer, expected_reward)",
            1,
        )
    try:
        parsed = read_cases(path)
    except ValueError as exc:
        fail(str(exc), 2)

    async def run_all() -> list:
        return [
            await run_case(env_cls, case, line, name=spec.name, args=spec.args)
            for line, case in parsed
        ]

    results = asyncio.run(run_all())
    table = Table(title=f"{name}: verifier cases ({path.name})")
    for column in ("case", "expected", "reward", "result"):
        table.add_column(column)
    for r in results:
        reward = "-" if r.reward is None else f"{r.reward:g}"
        verdict = "[green]pass" if r.passed else "[red]FAIL"
        table.add_row(r.name, f"{r.expected:g}", reward, verdict)
    Console().print(table)
    failed = [r for r in results if not r.passed]
    for r in failed:
        console.print(
            f"[red]FAILED[/red] case '{r.name}' ({path.name} line {r.line}): {r.error}",
            highlight=False,
        )
    if failed:
        raise typer.Exit(1)
    console.print(f"{len(results)} verifier case(s) passed")
    if not cases_only and tool_tests_folder(env_cls) is not None:
        missing = missing_test_packages()
        if missing:
            fail(
                f"the tool tests of '{name}' did not run: they need {', '.join(missing)}, not "
                "installed here: pip install 'rayrollout[dev]' (or pass --cases-only to run "
                "only the verifier cases)",
                1,
            )
        code = run_tool_tests(env_cls, ["-k", select] if select else None)
        if code not in (0, 5):  # 5: the folder has no tests
            console.print(f"[red]FAILED[/red] tool tests of '{name}' (pytest exit code {code})")
            raise typer.Exit(1)


@env_app.command("serve")
def env_serve(
    name: Annotated[str, typer.Argument(help="Registered environment name or 'module:Class'.")],
    replicas: Annotated[int, typer.Option("--replicas", help="Serve replicas.")] = 1,
    port: Annotated[int, typer.Option("--port", help="Serve HTTP port.")] = 8000,
    host: Annotated[str, typer.Option("--host", help="Serve HTTP bind address.")] = "127.0.0.1",
    namespace: Annotated[str, typer.Option("--namespace", help="Ray namespace.")] = "rayrollout",
    route_prefix: Annotated[
        str,
        typer.Option(
            "--route-prefix",
            help="Where the routes live on the port. The default '/' is what NeMo Gym's agents "
            "expect (they address a resources server by host:port); give a path to serve "
            "several environments on one Serve port.",
        ),
    ] = "/",
    detach: Annotated[
        bool, typer.Option("--detach", help="Deploy and return instead of waiting for Ctrl-C.")
    ] = False,
    session_idle_timeout: Annotated[
        float,
        typer.Option(
            "--session-idle-timeout",
            min=0.001,
            help="Seconds without a call after which a session's state is released (clients "
            "that never verify or close).",
        ),
    ] = DEFAULT_SESSION_IDLE_TIMEOUT_S,
    config_file: ConfigFile = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="File holding the bearer token requests must send ('Authorization: Bearer "
            "TOKEN'); made (owner-only) with a new token when missing.",
            show_default="NAME-PORT.token in ~/.rayrollout/env-serve",
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Take requests without a token: anyone who reaches HOST:PORT runs the "
            "environment's tools. For NeMo Gym's agents, which send no credentials (ng_run's "
            "entrypoint passes it); keep HOST a loopback address.",
        ),
    ] = False,
) -> None:
    """Serve an environment over NeMo Gym's resources-server HTTP protocol.

    Requests must carry the bearer token in --token-file (printed at start); NeMo Gym's
    simple_agent and ng_collect_rollouts send none, so ng_run starts it with --no-auth
    (see docs/how-to/nemo-gym.md).
    """
    import time

    import ray
    from ray import serve

    from rayrollout.auth import RouteAuth
    from rayrollout.data.config import RunConfig
    from rayrollout.engine.startup import ensure_ray, ensure_serve
    from rayrollout.envkit.registry import configured_environment
    from rayrollout.envkit.server import environment_app, environment_app_name

    if not route_prefix.startswith("/"):
        fail(f"--route-prefix must start with '/', got {route_prefix!r}", 2)
    if no_auth and token_file is not None:
        fail("--no-auth and --token-file contradict each other: pass one", 2)
    route = route_prefix.rstrip("/") or "/"
    spec = configured_environment(name, config_file)
    spec.load()  # an unknown or unimportable class fails here, before Ray starts
    if no_auth:
        auth, token_note = RouteAuth.open(), ""
        console.print(
            "[yellow]WARNING[/yellow]: no token (--no-auth): anyone who reaches "
            f"{host}:{port} runs environment '{spec.name}''s tools and verifier. Only for "
            "NeMo Gym's agents (they send no credentials), on a loopback or private address",
            highlight=False,
        )
    else:
        auth, token_note = _serve_token(token_file, spec.name, port)
    config = RunConfig.model_validate(
        {"namespace": namespace, "ray": {"serve_port": port, "serve_host": host}}
    )
    started_ray = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    ensure_ray(config)
    ensure_serve(config)
    app = environment_app(
        spec,
        num_replicas=replicas,
        session_idle_timeout_s=session_idle_timeout,
        auth=auth,
    )
    serve.run(app, name=environment_app_name(namespace, spec.name), route_prefix=route)
    url = f"http://{host}:{port}{'' if route == '/' else route}"
    console.print(
        f"environment '{spec.name}' speaks NeMo Gym's protocol at {url} (POST /seed_session, "
        f"/<tool>, /verify, /close_session, /aggregate_metrics; GET / lists the tools){token_note}",
        highlight=False,
        soft_wrap=True,  # unwrapped: the URL and the token's path stay whole, to copy
    )
    typer.echo(url)
    if detach:
        return
    # A supervisor (NeMo Gym's ng_run) stops servers with SIGINT and SIGKILLs what is still
    # up a second later; SIGTERM is the other usual stop. Both end the serve loop at once.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        if started_ray:
            # The Ray this command started goes with it, and Serve in it. ray.shutdown stops
            # its daemons one by one (1.4 s measured, more on a busy machine), and those it
            # had not stopped when the supervisor's SIGKILL came a second later stayed up
            # (gcs_server, log_monitor, ...): they are killed at once first.
            _kill_descendants(os.getpid())
            ray.shutdown()
        else:
            serve.delete(environment_app_name(namespace, spec.name))


def descendants(pid: int) -> set[int]:
    """PIDs of every living process below ``pid`` (Linux: read from /proc; elsewhere none).
    The nemo_gym tier's harness uses it too, to name the processes ``env serve`` started."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            # pid (comm) state ppid ...: comm may hold spaces or parentheses
            ppid = int(entry.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        children.setdefault(ppid, []).append(int(entry.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _kill_descendants(pid: int) -> None:
    """SIGKILL every process below ``pid``."""
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def _serve_token(token_file: Path | None, name: str, port: int) -> tuple[Any, str]:
    """The ``RouteAuth`` of ``env serve`` and the line telling clients where its token is:
    the file's token, or a new one written there (owner-only) when the file is missing."""
    from rayrollout.auth import RouteAuth, read_token_file, write_token_file

    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path = token_file or Path.home() / ".rayrollout" / "env-serve" / f"{safe_name}-{port}.token"
    try:
        token = read_token_file(path) if path.exists() else write_token_file(path)
    except (OSError, ValueError) as exc:
        fail(f"--token-file {path}: {exc}", 2)
    note = f"; requests send 'Authorization: Bearer TOKEN' with the token in {path}"
    return RouteAuth.bearer(token), note


@env_app.command("nemo-gym-config")
def env_nemo_gym_config(
    name: Annotated[str, typer.Argument(help="Registered environment name or 'module:Class'.")],
    port: Annotated[int, typer.Option("--port", help="Port the environment serves on.")] = 8123,
    host: Annotated[str, typer.Option("--host", help="Address it binds.")] = "127.0.0.1",
    model_server: Annotated[
        str, typer.Option("--model-server", help="Your NeMo Gym model server's config key.")
    ] = "policy_model",
) -> None:
    """Print a NeMo Gym config that runs environment NAME for NeMo Gym's own agents.

    The YAML declares the resources server (ng_run starts it with `rayrollout env serve`
    through the entrypoint rayrollout ships), a simple_agent using it, and its environment
    server; add your model server block and pass the file to ng_run.
    """
    import yaml

    from rayrollout.envkit.nemo_gym.ng_run_config import (
        nemo_gym_root,
        resources_server_block,
        simple_agent_block,
    )
    from rayrollout.envkit.registry import load_environment

    env_cls = load_environment(name)
    server = f"rayrollout_{env_cls.name}"
    config = {
        **resources_server_block(server, name, host=host, port=port),
        **simple_agent_block(f"{env_cls.name}_simple_agent", server, model_server),
    }
    typer.echo(
        f"# ng_run finds the entrypoint through:  export NEMO_GYM_EXTRA_ROOTS={nemo_gym_root()}"
    )
    typer.echo(
        "# NeMo Gym's agents send no credentials, so ng_run serves the environment without a "
        f"token (env serve --no-auth) on {host}:{port}: keep it a loopback or private address"
    )
    typer.echo(yaml.safe_dump(config, sort_keys=False), nl=False)


@env_app.command("tasks")
def env_tasks(
    name: Annotated[str, typer.Argument(help="Environment with a task generator.")],
    dataset: Annotated[
        list[str], typer.Option("--dataset", help="Generator dataset name (repeatable).")
    ],
    size: Annotated[int, typer.Option("--size", help="Tasks per dataset.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Generator seed.")] = 0,
) -> None:
    """Print generated task rows as JSONL (e.g. reasoning_gym's procedural datasets)."""
    from rayrollout.envkit.registry import load_environment

    env_cls = load_environment(name)
    generate = getattr(env_cls, "generate_tasks", None)
    if generate is None:
        fail(
            f"environment '{name}' has no task generator (a 'generate_tasks' classmethod); "
            "its example tasks are files in its folder",
            2,
        )
    try:
        for row in generate(dataset=dataset, size=size, seed=seed):
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    except (ImportError, ValueError) as exc:
        fail(str(exc), 2)
