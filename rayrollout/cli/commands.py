"""The ``rayrollout`` command line: collect, demo, up|status|down, show, report, export,
env list|test|serve|tasks.

Over 500 lines and still one job: every function here parses flags, turns bad input into a
one-line error with an exit code, and calls into the module that does the work (``api``,
``cluster``, ``show``, ``report``, ``export``, ``env_testing``). Keeping the commands in one
typer app keeps ``--help`` and the shared options (config file, flag overrides) in one place.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from rayrollout.data.config import (
    DEFAULT_SESSION_IDLE_TIMEOUT_S,
    ConfigError,
    RunConfig,
    load_config,
)
from rayrollout.data.tasks import InvalidTaskError, read_tasks
from rayrollout.engine.services import PolicyEndpointError
from rayrollout.environment.registry import (
    UnknownEnvironmentError,
    available_environments,
    load_environment,
)

if TYPE_CHECKING:
    from rayrollout.environment import Environment

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="rayrollout: scored multi-turn agent rollouts on Ray.",
)
env_app = typer.Typer(no_args_is_help=True, help="Inspect registered environments.")
app.add_typer(env_app, name="env")
console = Console(stderr=True)
MAX_ERRORS_SHOWN = 50
REJECTS_FILE = "_rejects.jsonl"


def main() -> None:
    app()


def _overrides(**flags: Any) -> dict[str, Any]:
    """CLI flags as a nested config override, leaving out flags not given."""
    out: dict[str, Any] = {}
    for dotted, value in flags.items():
        if value is None or value is False:
            continue
        node = out
        *parents, leaf = dotted.split("__")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out


def _known_environment(config: RunConfig) -> Any:
    names = set(available_environments()) | set(config.environments)

    def check(name: str) -> bool:
        if name in names:
            return True
        try:
            load_environment(name)
        except UnknownEnvironmentError:
            return False
        names.add(name)
        return True

    return check


def _validate_all(config: RunConfig, tasks_path: Path) -> int:
    """Read the whole file once; print one error per bad row; return the number of tasks."""
    errors: list[InvalidTaskError] = []
    count = 0
    for _ in read_tasks(
        tasks_path,
        default_environment=config.environment,
        check_environment=_known_environment(config),
        on_invalid=lambda exc, raw: errors.append(exc),
    ):
        count += 1
    if errors:
        for exc in errors[:MAX_ERRORS_SHOWN]:
            console.print(f"[red]error[/red] {exc}", highlight=False)
        if len(errors) > MAX_ERRORS_SHOWN:
            console.print(f"... and {len(errors) - MAX_ERRORS_SHOWN} more")
        console.print(
            f"{len(errors)} invalid row(s) in {tasks_path}; nothing was run. Fix them, "
            "or pass --skip-invalid to run the valid rows and write the rest to "
            f"{REJECTS_FILE} in the output folder."
        )
        raise typer.Exit(2)
    return count


def _limited(tasks: Iterator[Any], limit: int | None) -> Iterator[Any]:
    for i, task in enumerate(tasks):
        if limit is not None and i >= limit:
            return
        yield task


def run_collect(config: RunConfig) -> dict[str, Any]:
    """Run ``collect`` for a validated config: the CLI's body, callable from Python too."""
    from rayrollout.api.rollout_engine import RolloutEngine, expand
    from rayrollout.cli.progress import RunProgress, summary_table
    from rayrollout.data.writer import written_keys

    if not config.tasks:
        raise ConfigError("no tasks file: pass TASKS or set 'tasks' in the config")
    # Absolute before Ray starts: a driver under `ray job submit` may change directory, and
    # the engine actor writes from its own working directory.
    tasks_path = Path(config.tasks).absolute()
    if not tasks_path.exists():
        raise ConfigError(f"tasks file not found: {tasks_path}")
    out_dir = Path(config.output.dir).absolute()
    config.output.dir = str(out_dir)
    total = None
    if not config.skip_invalid:
        total = _validate_all(config, tasks_path)
        if config.limit:
            total = min(total, config.limit)
        total *= config.num_repeats
    rejects = 0

    def reject(exc: InvalidTaskError, raw: str | None) -> None:
        nonlocal rejects
        rejects += 1
        out_dir.mkdir(parents=True, exist_ok=True)
        with (out_dir / REJECTS_FILE).open("a", encoding="utf-8") as file:
            file.write(json.dumps(exc.to_record(raw), ensure_ascii=False) + "\n")
        console.print(f"[yellow]skipped[/yellow] {exc}", highlight=False)

    tasks = _limited(
        read_tasks(
            tasks_path,
            default_environment=config.environment,
            check_environment=_known_environment(config),
            on_invalid=reject,
        ),
        config.limit,
    )
    engine = RolloutEngine(config)
    with engine:
        engine.start()  # holds the output folder's lock from here on
        done = written_keys(out_dir, config.output.format) if config.resume else set()
        if config.resume:
            console.print(f"resume: {len(done)} episode(s) already in {out_dir}")
        if total is not None:
            total = max(0, total - len(done))
        specs = expand(tasks, config.num_repeats, done)
        console.print(
            f"policy: {engine.policy_url} ({config.policy.model}); "
            f"agents: {config.agents.num_agents}; concurrency: {config.concurrency}"
        )
        try:
            with RunProgress(console, total) as progress:
                summary = engine.run(specs, on_progress=progress.update)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted:[/yellow] writing finished episodes ...")
            engine.flush()
            console.print(
                f"finished episodes are in {out_dir}; run again with --resume to complete"
            )
            raise typer.Exit(130) from None
    console.print(summary_table(summary))
    if rejects:
        console.print(f"{rejects} invalid row(s) skipped; see {out_dir / REJECTS_FILE}")
    console.print(
        f"[green]wrote {summary['rows_written']} trajectories[/green] to {out_dir}/ "
        f"({config.output.format}); open with pandas.read_parquet('{out_dir}') "
        "or ray.data.read_parquet."
    )
    return summary


def parse_env_urls(values: list[str], default_name: str | None = None) -> dict[str, dict[str, str]]:
    """``--env-url NAME=URL`` flags as ``environments: {NAME: {url: URL}}`` overrides.

    A bare ``--env-url URL`` names the ``--env`` environment.
    """
    out: dict[str, dict[str, str]] = {}
    for value in values:
        if value.startswith(("http://", "https://")):  # bare URL: the --env environment
            name, sep, url = default_name or "", "=", value
        else:
            name, sep, url = value.partition("=")
        if not sep or not name.strip() or not url.strip():
            raise ConfigError(
                f"--env-url {value!r}: expected NAME=URL, e.g. --env-url "
                "weather=http://127.0.0.1:8001"
            )
        out[name.strip()] = {"url": url.strip()}
    return out


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@app.command()
def collect(
    tasks: Annotated[
        Path | None,
        typer.Argument(help="Tasks file: JSONL or Parquet rows (rayrollout or NeMo Gym format)."),
    ] = None,
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="Output folder of part files.")
    ] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="parquet (default) or jsonl.")] = None,
    env: Annotated[
        str | None, typer.Option("--env", help="Environment for rows that name none.")
    ] = None,
    env_url: Annotated[
        list[str] | None,
        typer.Option(
            "--env-url",
            help="NAME=URL: use the NeMo Gym resources server at URL as environment NAME "
            "(repeatable); rows name it in 'environment' or via --env NAME.",
        ),
    ] = None,
    policy: Annotated[
        str | None, typer.Option("--policy", help="'scripted' (built-in test policy).")
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option("--base-url", help="OpenAI-compatible endpoint; key from OPENAI_API_KEY."),
    ] = None,
    policy_config: Annotated[
        Path | None,
        typer.Option(
            "--policy-config",
            help="Deploy vLLM on Ray Serve LLM from this file (deployments/vllm/cpu.yaml).",
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model name sent to the endpoint.")
    ] = None,
    api: Annotated[str | None, typer.Option("--api", help="chat (default) or responses.")] = None,
    num_repeats: Annotated[
        int | None, typer.Option("--num-repeats", "-n", help="Samples per task.")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", help="Episodes in flight at most.")
    ] = None,
    num_agents: Annotated[int | None, typer.Option("--num-agents", help="Agent actors.")] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Read at most this many tasks.")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Write only (task_id, sample_index) pairs missing from --out."
        ),
    ] = False,
    skip_invalid: Annotated[
        bool,
        typer.Option("--skip-invalid", help=f"Run valid rows; write bad ones to {REJECTS_FILE}."),
    ] = False,
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Ray namespace of the run.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML config; flags override it.")
    ] = None,
) -> None:
    """Run every task as a scored multi-turn episode and stream trajectories to --out."""
    if sum(bool(x) for x in (base_url, policy_config, policy == "scripted")) > 1:
        console.print(
            "[red]error[/red] --policy scripted, --base-url and --policy-config exclude each other"
        )
        raise typer.Exit(2)
    overrides = _overrides(
        tasks=str(tasks) if tasks else None,
        output__dir=out,
        output__format=fmt,
        environment=env,
        policy__base_url=base_url,
        policy__model=model,
        policy__api=api,
        num_repeats=num_repeats,
        concurrency=concurrency,
        agents__num_agents=num_agents,
        limit=limit,
        resume=resume,
        skip_invalid=skip_invalid,
        namespace=namespace,
        policy__kind="openai" if base_url else ("vllm" if policy_config else policy),
        policy__vllm_config=str(policy_config) if policy_config else None,
    )
    try:
        if env_url:
            overrides["environments"] = parse_env_urls(env_url, env)
        run_config = load_config(config, overrides)
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        run_collect(run_config)
    except (ConfigError, FileNotFoundError, PolicyEndpointError) as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None


def _cluster_config(config: Path | None, namespace: str | None, address: str | None) -> RunConfig:
    overrides = _overrides(namespace=namespace, ray__address=address)
    try:
        return load_config(config, overrides)
    except ConfigError as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None


_NAMESPACE_OPTION = typer.Option("--namespace", help="Ray namespace (default: the config's).")
_ADDRESS_OPTION = typer.Option(
    "--address", help="Ray cluster to join (default: RAY_ADDRESS, else the config's)."
)


@app.command()
def up(
    config: Annotated[Path, typer.Option("--config", help="YAML config of the services.")],
    namespace: Annotated[str | None, _NAMESPACE_OPTION] = None,
    address: Annotated[str | None, _ADDRESS_OPTION] = None,
) -> None:
    """Start the policy, the environments and a detached engine; collect then attaches to them."""
    from rayrollout.api.cluster import up as cluster_up

    run_config = _cluster_config(config, namespace, address)
    try:
        state = cluster_up(run_config)
    except (RuntimeError, PolicyEndpointError) as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(state, indent=2, default=str))


@app.command()
def status(
    config: Annotated[Path | None, typer.Option("--config", help="YAML config.")] = None,
    namespace: Annotated[str | None, _NAMESPACE_OPTION] = None,
    address: Annotated[str | None, _ADDRESS_OPTION] = None,
) -> None:
    """List what is up in the namespace: Serve apps, replicas per node, agents, engine health."""
    from rayrollout.api.cluster import status as cluster_status
    from rayrollout.engine.services import ensure_ray

    run_config = _cluster_config(config, namespace, address)
    ensure_ray(run_config)
    typer.echo(json.dumps(cluster_status(run_config.namespace), indent=2, default=str))


@app.command()
def down(
    config: Annotated[Path | None, typer.Option("--config", help="YAML config.")] = None,
    namespace: Annotated[str | None, _NAMESPACE_OPTION] = None,
    address: Annotated[str | None, _ADDRESS_OPTION] = None,
) -> None:
    """Remove the namespace's engine, agents, policy and environment apps."""
    from rayrollout.api.cluster import down as cluster_down
    from rayrollout.engine.services import ensure_ray

    run_config = _cluster_config(config, namespace, address)
    ensure_ray(run_config)
    for item in cluster_down(run_config.namespace):
        typer.echo(f"removed {item}")


@app.command()
def demo(
    out: Annotated[str, typer.Option("--out", "-o", help="Output folder.")] = "rollouts/demo",
    num_repeats: Annotated[
        int, typer.Option("--num-repeats", "-n", help="Samples per example task.")
    ] = 12,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML config; flags override it.")
    ] = None,
) -> None:
    """Run the built-in environments' example tasks against the scripted policy, locally."""
    from rayrollout.cli.demo import demo_tasks_file

    tasks_file = demo_tasks_file(Path(out).parent / f".{Path(out).name}-tasks.jsonl")
    overrides = {"tasks": str(tasks_file), "output": {"dir": out}, "num_repeats": num_repeats}
    try:
        summary = run_collect(load_config(config, overrides))
    except (ConfigError, FileNotFoundError) as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    console.print(f"demo done: {summary['total']['episodes']} episodes in {out}/")


@app.command()
def show(
    directory: Annotated[Path, typer.Argument(help="Output folder of a run.")],
    task_id: Annotated[str, typer.Option("--task-id", help="Task to show.")],
    sample: Annotated[
        int | None, typer.Option("--sample", help="Sample index (default: every sample).")
    ] = None,
) -> None:
    """Print one trajectory as a readable conversation: messages, tool calls, reward, timings."""
    from rayrollout.cli.show import find_trajectories, render_trajectory

    found = find_trajectories(directory, task_id)
    if sample is not None:
        found = [t for t in found if t.sample_index == sample]
    if not found:
        which = f"task {task_id!r}" + (f" sample {sample}" if sample is not None else "")
        console.print(f"[red]error[/red] no trajectory of {which} in {directory}")
        raise typer.Exit(1)
    out = Console()
    for trajectory in found:
        render_trajectory(trajectory, out)


@app.command()
def report(
    directory: Annotated[Path, typer.Argument(help="Output folder of a run.")],
    html_path: Annotated[Path, typer.Option("--html", help="Where to write the page.")] = Path(
        "report.html"
    ),
) -> None:
    """Write one self-contained HTML page (plots embedded) describing a run's output."""
    from rayrollout.cli.report import render_report

    try:
        page = render_report(directory)
    except FileNotFoundError as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    html_path.write_text(page, encoding="utf-8")
    console.print(f"wrote {html_path} ({len(page) // 1024} KiB)")


@app.command()
def export(
    kind: Annotated[str, typer.Argument(help="sft, dpo, nemo-gym or verl.")],
    source: Annotated[
        Path, typer.Argument(help="Output folder of a run (Parquet or JSONL parts).")
    ],
    out: Annotated[
        Path,
        typer.Argument(
            help="File to write: .jsonl or .parquet (by suffix). nemo-gym also writes "
            "<stem>_failures.jsonl (failed episodes) and <stem>_materialized_inputs.jsonl "
            "beside it, as NeMo Gym's rollout collection does."
        ),
    ],
    min_reward: Annotated[
        float, typer.Option("--min-reward", help="sft: least reward of an 'ok' trajectory kept.")
    ] = 1.0,
    min_gap: Annotated[
        float,
        typer.Option("--min-gap", help="dpo: least reward gap between chosen and rejected."),
    ] = 0.5,
) -> None:
    """Write a run's trajectories as training data: TRL SFT or DPO rows, NeMo Gym rollouts, verl."""
    from rayrollout.data.export import ExportError, export_run

    try:
        summary = export_run(kind, source, out, min_reward=min_reward, min_gap=min_gap)
    except ExportError as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    console.print(
        f"wrote {summary.rows_written} {kind} row(s) to {out} "
        f"({summary.rows_read} trajectories read from {source})",
        highlight=False,
    )
    if kind == "nemo-gym":
        from rayrollout.data.export import nemo_gym_files

        files = nemo_gym_files(out)
        console.print(
            f"and {summary.failures_written} failed episode(s) to {files['failures']}, the "
            f"inputs to {files['inputs']} (NeMo Gym's rollout files)",
            highlight=False,
        )


def _environment_or_exit(name: str) -> type[Environment]:
    """The environment class ``name`` names, or exit 2 saying why it is unknown."""
    try:
        return load_environment(name)
    except UnknownEnvironmentError as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None


@env_app.command("list")
def env_list() -> None:
    """List registered environments with their hosting mode and tools."""
    from rich.table import Table

    table = Table(title="environments")
    for column in ("name", "class", "hosting", "tools"):
        table.add_column(column)
    for name, path in sorted(available_environments().items()):
        try:
            cls = load_environment(name)
            tools = ", ".join(t["function"]["name"] for t in cls.tool_schemas())
            table.add_row(name, path, cls.default_hosting, tools)
        except UnknownEnvironmentError as exc:
            table.add_row(name, path, "-", f"[red]{exc}")
    Console().print(table)


@env_app.command("test")
def env_test(
    name: Annotated[str, typer.Argument(help="Registered environment name or 'module:Class'.")],
    cases: Annotated[
        Path | None,
        typer.Option("--cases", help="Verifier cases file (default: verifier_cases.jsonl)."),
    ] = None,
    cases_only: Annotated[
        bool, typer.Option("--cases-only", help="Skip the tool tests (the folder's tests/).")
    ] = False,
    select: Annotated[
        str | None, typer.Option("-k", help="Run only the tool tests matching this expression.")
    ] = None,
) -> None:
    """Run an environment's verifier cases, then its tool tests; non-zero naming any failure."""
    import asyncio

    from rich.table import Table

    from rayrollout.environment.testing import (
        CASES_FILE,
        environment_folder,
        read_cases,
        run_case,
        run_tool_tests,
    )

    env_cls = _environment_or_exit(name)
    path = cases or environment_folder(env_cls) / CASES_FILE
    if not path.exists():
        console.print(
            f"[red]error[/red] no verifier cases for '{name}': write {path} (one JSON case a "
            "line: name, task, messages, final_answer, expected_reward)",
            highlight=False,
        )
        raise typer.Exit(1)
    try:
        parsed = read_cases(path)
    except ValueError as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None

    async def run_all() -> list:
        return [await run_case(env_cls, case, line) for line, case in parsed]

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
    if not cases_only:
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
) -> None:
    """Serve an environment over NeMo Gym's resources-server HTTP protocol (for NeMo Gym agents).

    NeMo Gym's simple_agent and ng_collect_rollouts use it at http://HOST:PORT as they use
    their own resources servers (see README, "NeMo Gym").
    """
    import os
    import time

    import ray
    from ray import serve

    from rayrollout.engine.services import ensure_ray, ensure_serve
    from rayrollout.environment.hosting import environment_app, environment_app_name

    if not route_prefix.startswith("/"):
        console.print(
            f"[red]error[/red] --route-prefix must start with '/', got {route_prefix!r}",
            highlight=False,
        )
        raise typer.Exit(2)
    route = route_prefix.rstrip("/") or "/"
    env_cls = _environment_or_exit(name)
    config = RunConfig.model_validate(
        {"namespace": namespace, "ray": {"serve_port": port, "serve_host": host}}
    )
    started_ray = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    ensure_ray(config)
    ensure_serve(config)
    app = environment_app(
        f"{env_cls.__module__}:{env_cls.__qualname__}",
        num_replicas=replicas,
        session_idle_timeout_s=session_idle_timeout,
    )
    serve.run(app, name=environment_app_name(namespace, env_cls.name), route_prefix=route)
    url = f"http://{host}:{port}{'' if route == '/' else route}"
    console.print(
        f"environment '{env_cls.name}' speaks NeMo Gym's protocol at {url} (POST /seed_session, "
        "/<tool>, /verify, /close_session, /aggregate_metrics; GET / lists the tools)",
        highlight=False,
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
            # The Ray this command started goes with it, and Serve in it: ray.shutdown ends
            # every daemon now (measured 1.4 s), where waiting on serve.delete first left
            # Ray's dashboard agent orphaned when the supervisor's SIGKILL came.
            ray.shutdown()
        else:
            serve.delete(environment_app_name(namespace, env_cls.name))


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

    from rayrollout.environment.nemo_gym.config import (
        nemo_gym_root,
        resources_server_block,
        simple_agent_block,
    )

    env_cls = _environment_or_exit(name)
    server = f"rayrollout_{env_cls.name}"
    config = {
        **resources_server_block(server, name, host=host, port=port),
        **simple_agent_block(f"{env_cls.name}_simple_agent", server, model_server),
    }
    typer.echo(
        f"# ng_run finds the entrypoint through:  export NEMO_GYM_EXTRA_ROOTS={nemo_gym_root()}"
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
    env_cls = _environment_or_exit(name)
    generate = getattr(env_cls, "generate_tasks", None)
    if generate is None:
        console.print(
            f"[red]error[/red] environment '{name}' has no task generator (a "
            "'generate_tasks' classmethod); its example tasks are files in its folder",
            highlight=False,
        )
        raise typer.Exit(2)
    try:
        for row in generate(dataset=dataset, size=size, seed=seed):
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    except (ImportError, ValueError) as exc:
        console.print(f"[red]error[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
