"""``rayrollout collect`` and ``rayrollout demo``: flags to a config, one
``RolloutEngine.collect``, and what a terminal shows of it (skipped rows, progress, summary).

Planning and checks are the API's, so a Python caller gets the same run; a mistake is one
line and exit 2 before Ray starts.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from rayrollout.cli.common import console, fail, overrides
from rayrollout.cli.console_log import routed_logs

# The API, the config and the output folder (Ray, pydantic, pyarrow) load when a command
# runs, not when the app is built: `rayrollout --help` imports none of them.
if TYPE_CHECKING:
    from rayrollout.api.collect import CollectPlan
    from rayrollout.data.config import RunConfig
    from rayrollout.engine.run_figures import RunSnapshot

# rayrollout.data.run_folder.REJECTS_FILE, spelled out for --help (tests/test_startup.py)
_REJECTS_FILE = "_rejects.jsonl"

__all__ = ["collect", "demo", "parse_env_urls", "run_collect"]


def run_collect(config: RunConfig) -> RunSnapshot:
    """Run ``collect`` for a config, showing progress and the summary; returns the figures.

    Every check before start and the tasks' first rows run first (``plan_collect``), so a
    mistake costs no Ray start-up; a tasks file without rows ends here with a notice, exit 0.
    The rest of the rows stream to the engine as it takes them: a row skipped on the way is
    printed as it is met (the first ``MAX_ERRORS_SHOWN``), and the bar's total, an estimate
    from a count of the rows made beside the start, appears once the count is done.
    """
    from rayrollout.api.collect import MAX_ERRORS_SHOWN, plan_collect

    # The engine (Ray, Serve) is imported once the checks before start have passed: a dead
    # policy URL or a bad first row is reported without paying for it.
    plan = plan_collect(None, config, before_start=True, require_key=True)
    if plan.empty:
        console.print(
            f"nothing to run: {plan.source} has no tasks (not one row); nothing was started "
            "and no output folder was made",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(0)
    from rayrollout.api.rollout_engine import RolloutEngine
    from rayrollout.cli.progress import RunProgress, summary_table
    from rayrollout.data.run_folder import REJECTS_FILE

    engine = RolloutEngine(config)
    progress = RunProgress(console)
    planned: list[CollectPlan] = []

    def show_plan(plan: CollectPlan) -> None:
        # Again now that Ray is up: ray.init installs its own SIGTERM handler (it prints a
        # stack and dies with rc 15), which would skip the flush of finished episodes.
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        planned.append(plan)
        for exc, _ in plan.rejects[:MAX_ERRORS_SHOWN]:
            console.print(f"[yellow]skipped[/yellow] {escape(str(exc))}", highlight=False)
        plan.on_reject = skipped
        if engine.config.resume:
            console.print(
                f"resume: {len(plan.written)} episode(s) already in {engine.config.output.dir}"
            )
        console.print(
            f"policy: {engine.policy_url} ({engine.config.policy.model}); "
            f"workers: {config.workers.num_workers}; concurrency: {config.concurrency}"
        )
        progress.begin(plan.episodes)

    def skipped(exc: Exception) -> None:  # a row skipped while the run streams
        if planned[0].rejected <= MAX_ERRORS_SHOWN:
            console.print(f"[yellow]skipped[/yellow] {escape(str(exc))}", highlight=False)

    def update(snapshot: RunSnapshot) -> None:
        if planned and not planned[0].complete:  # the estimate moves as rows are counted
            progress.begin(planned[0].episodes)  # and rejected
        progress.update(snapshot)

    with engine:
        try:
            with progress:
                result = engine.collect(plan, on_plan=show_plan, on_progress=update)
                progress.begin(result.summary.total.episodes)  # the bar ends full
        except KeyboardInterrupt:
            console.print("[yellow]interrupted:[/yellow] writing finished episodes ...")
            engine.flush()
            where = engine.config.output.dir  # an attached engine's, once started
            console.print(f"finished episodes are in {where}; run again with --resume to complete")
            raise typer.Exit(130) from None
    summary = result.summary
    out_dir, fmt = Path(engine.config.output.dir), engine.config.output.format
    console.print(summary_table(summary))
    rejects = planned[0].rejected if planned else 0
    if rejects:
        console.print(f"{rejects} invalid row(s) skipped; see {out_dir / REJECTS_FILE}")
    console.print(  # unwrapped: the path and the call stay whole, to copy
        f"[green]wrote {summary.rows_written} trajectories[/green] to {out_dir}/ "
        f"({fmt}); {_how_to_open(out_dir)}",
        soft_wrap=True,
    )
    return summary


def _how_to_open(out_dir: Path) -> str:
    """How to read the folder back, for the formats its parts are in: a JSONL folder is not
    Parquet, and a folder holding both (a run resumed in another format) reads whole only
    through rayrollout."""
    from rayrollout.data.run_folder import RunFolder

    formats = {part.suffix for part in RunFolder(out_dir).parts()}
    if formats == {".parquet"}:
        return f"open with pandas.read_parquet('{out_dir}') or ray.data.read_parquet."
    if formats == {".jsonl"}:
        return (
            f"open with rayrollout.read_trajectories('{out_dir}'), or pandas.read_json(part, "
            "lines=True) for each part-*.jsonl."
        )
    return f"open with rayrollout.read_trajectories('{out_dir}') (it reads every format)."


def parse_env_urls(values: list[str], default_name: str | None = None) -> dict[str, dict[str, str]]:
    """``--env-url NAME=URL`` flags as ``environments: {NAME: {url: URL}}`` overrides.

    A bare ``--env-url URL`` names the ``--env`` environment.
    """
    from rayrollout.data.config import ConfigError

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
    """SIGTERM (a scheduler's stop, ``kill``) ends the run as Ctrl-C does: finished episodes
    are written, then exit 130, and ``--resume`` completes the run."""
    raise KeyboardInterrupt


# collect's flags, in the order `collect --help` lists them (the demo shares --config).
# readable=False: click's own check would print a boxed usage error; the API's check
# (api.preflight.check_tasks_file) prints one line naming the fix, for Python callers too.
_TASKS = typer.Argument(
    help="Tasks file: JSONL or Parquet rows (rayrollout or NeMo Gym format), or a directory "
    "or quoted glob of such shards (read through Ray Data).",
    readable=False,
)
# A flag left out takes the --config file's value, else the config's own default: --help
# shows both (spelled out so that --help loads no config; tests/test_cli_help.py checks them).
_OUT = typer.Option(
    "--out",
    "-o",
    help="Output folder of part files.",
    show_default="--config's output.dir, else rollouts",
)
_FORMAT = typer.Option(
    "--format",
    help="parquet or jsonl.",
    show_default="--config's output.format, else parquet",
)
_ENV = typer.Option("--env", help="Environment for rows that name none.")
_AGENT = typer.Option(
    "--agent",
    help="Agent for rows that name none (`rayrollout agent list`). Unset, an environment "
    "that declares one plays with its own (reset_step for GEM, skyrl-gym and OpenEnv; "
    "verifiers for verifiers).",
    show_default="--config's agent, else tool_loop",
)
_ENV_URL = typer.Option(
    "--env-url",
    help="NAME=URL: use the NeMo Gym resources server at URL as environment NAME "
    "(repeatable). Rows name it in 'environment'; rows that name none play on it when it is "
    "the only --env-url and no --env is set.",
)
_POLICY = typer.Option(
    "--policy",
    help="Policy kind: 'scripted' (built-in test policy), or one a package registers "
    "(rayrollout.policies entry point), its own settings in --config's policy section.",
    show_default="--config's policy.kind, else scripted",
)
_BASE_URL = typer.Option(
    "--base-url",
    help="OpenAI-compatible endpoint; key from OPENAI_API_KEY (OPENAI_API_KEY=EMPTY: none "
    "needed). Checked before start: GET BASE_URL/models.",
)
_POLICY_CONFIG = typer.Option(
    "--policy-config",
    help="Deploy vLLM on Ray Serve LLM from this file (rayrollout/deployments/vllm/cpu.yaml).",
)
_MODEL = typer.Option(
    "--model",
    help="Model name sent to the endpoint.",
    show_default="--config's policy.model, else scripted",
)
_API = typer.Option(
    "--api", help="chat or responses.", show_default="--config's policy.api, else chat"
)
_NUM_REPEATS = typer.Option(
    "--num-repeats",
    "-n",
    help="Samples per task.",
    show_default="--config's num_repeats, else 1",
)
_CONCURRENCY = typer.Option(
    "--concurrency",
    "-c",
    help="Episodes running at once, at most.",
    show_default="--config's concurrency, else 256",
)
_NUM_WORKERS = typer.Option(
    "--num-workers",
    help="Worker actors: Ray actors that each play their share of the episodes.",
    show_default="--config's workers.num_workers, else 2",
)
_LIMIT = typer.Option(
    "--limit", help="Read at most this many tasks.", show_default="--config's limit, else all"
)
_RESUME = typer.Option(
    "--resume",
    help="Finish the run in --out: write only the (task_id, sample_index) pairs missing there "
    "(parts of either format count). Without it (or --overwrite), an --out holding parts is "
    "refused.",
)
_OVERWRITE = typer.Option(
    "--overwrite",
    help="Delete the parts (and rejects) an earlier run left in --out before writing.",
)
_SKIP_INVALID = typer.Option(
    "--skip-invalid", help=f"Run valid rows; write bad ones to {_REJECTS_FILE}."
)
_NAMESPACE = typer.Option(
    "--namespace",
    help="Ray namespace of the run.",
    show_default="--config's namespace, else rayrollout",
)
_CONFIG = typer.Option("--config", help="YAML config; flags override it.")
_VERBOSE = typer.Option(
    "--verbose",
    "-v",
    help="Show Ray's, Serve's and the workers' logs on the console; without it they go to "
    "_logs/collect.log in the output folder.",
)

# The flags that set one config key as they are (``__`` nests: ``output__dir``).
_CONFIG_KEYS = {
    "out": "output__dir",
    "fmt": "output__format",
    "env": "environment",
    "agent": "agent",
    "base_url": "policy__base_url",
    "model": "policy__model",
    "api": "policy__api",
    "num_repeats": "num_repeats",
    "concurrency": "concurrency",
    "num_workers": "workers__num_workers",
    "limit": "limit",
    "resume": "resume",
    "overwrite": "output__overwrite",
    "skip_invalid": "skip_invalid",
    "namespace": "namespace",
}


def collect(
    tasks: Annotated[Path | None, _TASKS] = None,
    out: Annotated[str | None, _OUT] = None,
    fmt: Annotated[str | None, _FORMAT] = None,
    env: Annotated[str | None, _ENV] = None,
    env_url: Annotated[list[str] | None, _ENV_URL] = None,
    agent: Annotated[str | None, _AGENT] = None,
    policy: Annotated[str | None, _POLICY] = None,
    base_url: Annotated[str | None, _BASE_URL] = None,
    policy_config: Annotated[Path | None, _POLICY_CONFIG] = None,
    model: Annotated[str | None, _MODEL] = None,
    api: Annotated[str | None, _API] = None,
    num_repeats: Annotated[int | None, _NUM_REPEATS] = None,
    concurrency: Annotated[int | None, _CONCURRENCY] = None,
    num_workers: Annotated[int | None, _NUM_WORKERS] = None,
    limit: Annotated[int | None, _LIMIT] = None,
    resume: Annotated[bool, _RESUME] = False,
    overwrite: Annotated[bool, _OVERWRITE] = False,
    skip_invalid: Annotated[bool, _SKIP_INVALID] = False,
    namespace: Annotated[str | None, _NAMESPACE] = None,
    config: Annotated[Path | None, _CONFIG] = None,
    verbose: Annotated[bool, _VERBOSE] = False,
) -> None:
    """Run every task as a scored multi-turn episode and stream trajectories to --out.

    Exit codes: 0 done (the summary says why episodes failed, if any did);
    3 every episode failed; 2 bad input; 1 could not go on; 130 interrupted.
    """
    if sum(bool(x) for x in (base_url, policy_config, policy == "scripted")) > 1:
        fail("--policy scripted, --base-url and --policy-config exclude each other", 2)
    given = locals()  # the flags, by parameter name (None or False: not given)
    flags = overrides(
        **{key: given[name] for name, key in _CONFIG_KEYS.items()},
        tasks=str(tasks) if tasks else None,
        policy__kind="openai" if base_url else ("vllm" if policy_config else policy),
        policy__vllm_config=str(policy_config) if policy_config else None,
    )
    urls = parse_env_urls(env_url, env) if env_url else {}
    if urls:
        flags["environments"] = urls
    from rayrollout.data.config import load_config

    run_config = load_config(config, flags)
    if run_config.environment is None and len(urls) == 1:
        # One --env-url and no --env (flag or config): rows naming none play on that server.
        run_config = load_config(config, {**flags, "environment": next(iter(urls))})
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    with routed_logs(console, run_config.output.dir, verbose):
        summary = run_collect(run_config)
        from rayrollout.cli.failures import report_failures  # after the run, as the engine

        report_failures(console, summary)


def demo(
    out: Annotated[
        str, typer.Option("--out", "-o", help="Output folder (each demo run replaces its parts).")
    ] = "rollouts/demo",
    num_repeats: Annotated[
        int, typer.Option("--num-repeats", "-n", help="Samples per example task.")
    ] = 12,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            help="Agent that plays every episode.",
            show_default="--config's agent, else tool_loop",
        ),
    ] = None,
    config: Annotated[Path | None, _CONFIG] = None,
    verbose: Annotated[bool, _VERBOSE] = False,
) -> None:
    """Run the built-in environments' example tasks against the scripted policy, locally.

    One worker plays them, against the scripted policy in one plain Ray actor (on Serve
    when joining a cluster), unless --config sets workers.num_workers or
    policy.scripted.hosting.

    An environment this machine cannot run (the code sandbox without bubblewrap) is left
    out, with one line saying why and how to get it.
    """
    from rayrollout.cli.demo import demo_defaults, write_demo_tasks
    from rayrollout.cli.failures import report_failures
    from rayrollout.data.config import load_config

    tasks_file = Path(out).parent / f".{Path(out).name}-tasks.jsonl"
    # The demo's folder is its own: each demo run replaces the last one's parts.
    flags: dict[str, Any] = {
        "tasks": str(tasks_file),
        "output": {"dir": out, "overwrite": True},
        "num_repeats": num_repeats,
    }
    if agent:
        flags["agent"] = agent
    run_config = load_config(config, flags)
    run_config = load_config(config, {**flags, **demo_defaults(run_config)})
    for name, reason in write_demo_tasks(tasks_file, run_config).items():
        console.print(
            f"[yellow]left out[/yellow] environment '{name}': {escape(reason)}",
            highlight=False,
            soft_wrap=True,  # one line: the fix stays whole, to copy
        )
    with routed_logs(console, run_config.output.dir, verbose):
        summary = run_collect(run_config)
        report_failures(console, summary)
    console.print(f"demo done: {summary.total.episodes} episodes in {out}/")
