"""``rayrollout collect`` and ``rayrollout demo``: flags to a config, handed to ``run_collect``.

The config is read here once; ``terminal_run.run_collect`` plans, checks and runs it (the
API's planning, so a Python caller gets the same run), showing it on the terminal.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from rayrollout.cli.common import config_option, console, fail, overrides
from rayrollout.cli.console_log import routed_logs
from rayrollout.cli.terminal_run import run_collect, sigterm_as_interrupt

# rayrollout.data.run_folder.REJECTS_FILE, spelled out for --help (tests/test_startup.py)
_REJECTS_FILE = "_rejects.jsonl"

__all__ = ["collect", "demo", "parse_env_urls", "run_collect"]


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
_OUT = config_option("output.dir", "rollouts", "--out", "-o", help="Output folder of part files.")
_FORMAT = config_option("output.format", "parquet", "--format", help="parquet or jsonl.")
_ENV = typer.Option("--env", help="Environment for rows that name none.")
_AGENT = config_option(
    "agent",
    "tool_loop",
    "--agent",
    help="Agent for rows that name none (`rayrollout agent list`). Unset, an environment "
    "that declares one plays with its own (reset_step for GEM, skyrl-gym and OpenEnv; "
    "verifiers for verifiers).",
)
_ENV_URL = typer.Option(
    "--env-url",
    help="NAME=URL: use the NeMo Gym resources server at URL as environment NAME "
    "(repeatable). Rows name it in 'environment'; rows that name none play on it when it is "
    "the only --env-url and no --env is set.",
)
_POLICY = config_option(
    "policy.kind",
    "scripted",
    "--policy",
    help="Policy kind: 'scripted' (built-in test policy), or one a package registers "
    "(rayrollout.policies entry point), its own settings in --config's policy section.",
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
_MODEL = config_option(
    "policy.model", "scripted", "--model", help="Model name sent to the endpoint."
)
_API = config_option("policy.api", "chat", "--api", help="chat or responses.")
_NUM_REPEATS = config_option("num_repeats", "1", "--num-repeats", "-n", help="Samples per task.")
_CONCURRENCY = config_option(
    "concurrency", "256", "--concurrency", "-c", help="Episodes running at once, at most."
)
_NUM_WORKERS = config_option(
    "workers.num_workers",
    "2",
    "--num-workers",
    help="Worker actors: Ray actors that each play their share of the episodes.",
)
_LIMIT = config_option("limit", "all", "--limit", help="Read at most this many tasks.")
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
_NAMESPACE = config_option(
    "namespace", "rayrollout", "--namespace", help="Ray namespace of the run."
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
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
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
        config_option("agent", "tool_loop", "--agent", help="Agent that plays every episode."),
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
    console.print(f"demo done: {summary.total.episodes} episodes in {out}/", soft_wrap=True)
