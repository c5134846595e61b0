"""``rayrollout agent list|test``: the registered agents (episode loops), and one of them
played for a few episodes in this process, to see it work before a run.

``test`` plays it as a run would (``run_episode``, the config's limits) without Ray: the
environment inline, the policy at ``--base-url`` or the policy kind's in-process form.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from rayrollout.cli.common import config_option, console, fail, overrides

# The registry, the engine's episode and the policy client load in the command that needs
# them, not at import: `--help` should cost nothing (tests/test_startup.py).
if TYPE_CHECKING:
    from rayrollout.agentkit import Agent
    from rayrollout.agentkit.episode import GatewayOpener
    from rayrollout.data.config import RunConfig
    from rayrollout.data.schema import Task, Trajectory, Turn
    from rayrollout.policy.protocol import Policy

__all__ = ["agent_app"]

agent_app = typer.Typer(no_args_is_help=True, help="Inspect and try registered agents.")

_TEST_EXAMPLES = "tasks.jsonl"  # an environment folder's example tasks (the demo's too)
_FAILED = ("error", "timeout")  # statuses that say the agent, tools or policy broke


@agent_app.command("list")
def agent_list() -> None:
    """List registered agents (the 'rayrollout.agents' entry point) with what each does."""
    from rich.table import Table

    from rayrollout.agentkit.registry import UnknownAgentError, registered_agents

    # Two columns, the target under what the agent does: a target is up to ~50 characters,
    # and beside it in a column of its own the description had no room within 80 columns.
    table = Table(title="agents", show_lines=True)
    table.add_column("name", no_wrap=True)
    table.add_column("what it does (target)")
    for name, spec in sorted(registered_agents().items()):
        target = f"[dim]{escape(spec.target)}[/dim]"
        try:
            table.add_row(name, f"{escape(spec.describe())}\n{target}")
        except UnknownAgentError as exc:  # installed but not importable: say why, go on
            table.add_row(name, f"[red]{escape(str(exc))}[/red]\n{target}")
    Console().print(table)


@agent_app.command("test")
def agent_test(
    name: Annotated[str, typer.Argument(help="Registered agent name or 'module:Class'.")],
    env: Annotated[
        str | None,
        typer.Option("--env", help="Environment: its example tasks, or rows that name none."),
    ] = None,
    tasks: Annotated[
        Path | None,
        typer.Option("--tasks", help="Tasks file (JSONL or Parquet) instead of the examples."),
    ] = None,
    num_episodes: Annotated[
        int, typer.Option("--num-episodes", "-n", min=1, help="Episodes to play (first rows).")
    ] = 3,
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            help="OpenAI-compatible endpoint the agent's model calls go to; key from "
            "OPENAI_API_KEY (OPENAI_API_KEY=EMPTY: none needed). Without it: the scripted "
            "policy, in this process.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        config_option("policy.model", "scripted", "--model", help="Model name sent to it."),
    ] = None,
    api: Annotated[
        str | None,
        config_option("policy.api", "chat", "--api", help="chat or responses."),
    ] = None,
    episode_timeout: Annotated[
        float | None,
        config_option(
            "episode.timeout_s",
            "1800.0",
            "--episode-timeout",
            help="Seconds the agent may take per episode.",
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Run config: agent_settings.NAME (path, args), environments, episode "
            "limits, policy.",
        ),
    ] = None,
) -> None:
    """Play a few episodes of agent NAME in this process (no Ray) and show every model call.

    Shows each episode's status and reward and, per model call, its speaker,
    whether it extends that speaker's previous call, and what it sent.
    Without --base-url the model is the scripted policy, in this process.
    Exit 1 if an episode ended 'error' or 'timeout'; 2 for bad input
    (unknown agent, args that do not fit).
    """
    import asyncio

    from rayrollout.api.preflight import check_policy_key, probe_policy
    from rayrollout.data.config import load_config

    flags = overrides(
        environment=env,
        policy__kind="openai" if base_url else None,
        policy__base_url=base_url,
        policy__model=model,
        policy__api=api,
        episode__timeout_s=episode_timeout,
    )
    config = load_config(config_file, flags)
    agent = _build(name, config)
    rows = _tasks(config, tasks, num_episodes)
    if config.policy.base_url:
        probe_policy(config, check_policy_key(config, require_key=True))
        where = f"policy {config.policy.base_url} ({config.policy.model})"
    else:
        where = "the scripted policy, in this process (--base-url URL for a real model)"
    console.print(
        f"agent '{name}' on {len(rows)} episode(s); {where}",
        highlight=False,
        soft_wrap=True,  # the URL stays whole, to copy
    )
    trajectories = asyncio.run(_play_all(name, agent, rows, config))
    out = Console()
    for index, trajectory in enumerate(trajectories, start=1):
        _show(out, index, trajectory)
    failed = [(i, t) for i, t in enumerate(trajectories, start=1) if t.status in _FAILED]
    for index, trajectory in failed:
        console.print(
            f"[red]FAILED[/red] episode {index} (task {trajectory.task_id}): "
            f"{trajectory.status}: {escape(trajectory.error or '')}",
            highlight=False,
            soft_wrap=True,
        )
    if failed:
        raise typer.Exit(1)
    console.print(f"{len(trajectories)} episode(s) of agent '{name}' played without a fault")


def _build(name: str, config: RunConfig) -> Agent:
    """Agent ``name`` built as a worker actor builds it, with its config ``args``. An unknown
    name or args that do not fit its signature are the registry's one-line errors; a
    constructor that refuses its args' values (a ``ValueError``) is one line too, exit 2,
    where a run would fail each of its episodes with it."""
    from rayrollout.agentkit.registry import agent_spec
    from rayrollout.errors import RayrolloutError

    spec = agent_spec(name, config.agent_config(name))
    try:
        return spec.create()
    except RayrolloutError:
        raise
    except Exception as exc:
        fail(
            f"agent '{name}' ({spec.target}) refused its args {spec.args}: "
            f"{type(exc).__name__}: {exc}. Fix agent_settings.{name}.args in the --config file",
            2,
        )


def _tasks(config: RunConfig, path: Path | None, limit: int) -> list[Task]:
    """The first ``limit`` rows of ``path``, else of the ``--env`` environment's example
    tasks; each row's environment known (a bad row is one line, exit 2)."""
    from itertools import islice

    from rayrollout.api.preflight import (
        check_default_environment,
        check_tasks_file,
        environment_known,
    )
    from rayrollout.data.tasks import read_tasks
    from rayrollout.envkit.registry import environment_spec
    from rayrollout.envkit.testing import environment_folder

    check_default_environment(config)
    if path is not None:
        source = check_tasks_file(path)
    elif config.environment is not None:
        name = config.environment
        env_cls = environment_spec(name, config.environment_config(name)).load()
        source = environment_folder(env_cls) / _TEST_EXAMPLES
        if not source.is_file():
            fail(
                f"environment '{name}' ships no example tasks ({source} is missing): pass "
                "--tasks FILE",
                2,
            )
    else:
        fail("agent test needs tasks: pass --env ENV (its example tasks) or --tasks FILE", 2)
    rows = list(
        islice(
            read_tasks(
                source,
                default_environment=config.environment,
                check_environment=lambda env: environment_known(env, config),
            ),
            limit,
        )
    )
    if not rows:
        fail(f"{source} has no tasks (not one row): nothing to play", 2)
    return rows


async def _play_all(
    name: str, agent: Agent, rows: list[Task], config: RunConfig
) -> list[Trajectory]:
    """Play each task once, in order, against one policy client; every episode a row. The
    recording gateway is there for agents that run a program (it binds a loopback port
    only when an episode opens it), as in a worker actor."""
    from rayrollout.agentkit.gateway import Gateway
    from rayrollout.policy.client import PolicyClient

    base_url = config.policy.base_url
    policy: Policy
    if base_url:
        policy = PolicyClient(config.policy, base_url, max_connections=4)
    else:
        policy = _local_policy(config)
    gateway = Gateway()
    try:
        return [await _play_one(name, agent, task, config, policy, gateway) for task in rows]
    finally:
        await gateway.close()
        await policy.close()


def _local_policy(config: RunConfig) -> Policy:
    """The policy kind's in-process form (the scripted policy's, by default): found through
    the kind's registry, so the CLI names no plugin."""
    from rayrollout.policy.kinds import policy_kind

    name = config.policy.kind if config.policy.kind != "openai" else "scripted"
    local = policy_kind(name).local
    if local is None:
        fail(
            f"policy kind '{name}' has no in-process form: pass --base-url URL (and --model "
            "NAME) of an OpenAI-compatible server serving it",
            2,
        )
    return local(config)


async def _play_one(
    name: str,
    agent: Agent,
    task: Task,
    config: RunConfig,
    policy: Policy,
    gateway: GatewayOpener,
) -> Trajectory:
    """One episode as a worker actor plays it, with the environment inline: built with its
    config args; a class that cannot be built ends the episode 'error', as in a run."""
    from rayrollout.engine.episode_frame import run_episode
    from rayrollout.engine.episode_spec import EpisodeSpec, failed_trajectory
    from rayrollout.envkit.registry import environment_spec
    from rayrollout.envkit.sessions import InlineSession

    spec = EpisodeSpec(task)
    env_name = task.environment
    settings = config.environment_config(env_name)
    try:
        if settings.url is not None:
            raise ValueError(
                f"environment '{env_name}' is a remote server (environments.{env_name}.url); "
                "agent test hosts environments in this process: test it with `rayrollout "
                f"collect --agent {name}`"
            )
        env_spec = environment_spec(env_name, settings)
        env_cls = env_spec.load()
        session = InlineSession(env_cls, task, env_spec.args)
    except Exception as exc:
        error = f"environment unavailable: {type(exc).__name__}: {exc}"
        return failed_trajectory(spec, "agent-test", error, name)
    return await run_episode(
        spec,
        env_cls,
        session,
        policy,
        config.episode,
        "agent-test",
        agent=agent,
        played_by=name,
        gateway=gateway,
    )


def _show(out: Console, index: int, trajectory: Trajectory) -> None:
    """One episode: its status and reward, then a line per model call."""
    from rich.table import Table

    reward = "-" if trajectory.reward is None else f"{trajectory.reward:g}"
    status = trajectory.status
    colour = "red" if status in _FAILED else ("yellow" if status != "ok" else "green")
    table = Table(
        title=(
            f"episode {index}: {escape(trajectory.task_id)} ({escape(trajectory.environment)}) "
            f"[{colour}]{status}[/{colour}], reward {reward}, "
            f"{trajectory.metrics.tool_calls} tool call(s), "
            f"{trajectory.metrics.seconds_total:.3f} s"
        ),
        title_justify="left",
    )
    for column in ("turn", "speaker", "extends", "sent", "finish"):
        table.add_column(column)
    for number, turn in enumerate(trajectory.turns, start=1):
        table.add_row(
            str(number),
            escape(turn.speaker),
            "yes" if turn.extends_previous else "no: new sequence",
            _sent(turn),
            turn.finish_reason or "-",
        )
    out.print(table)


def _sent(turn: Turn) -> str:
    """What a model call sent: a prefix of the transcript, or messages of its own."""
    if turn.sent_messages is None:
        return f"first {turn.prompt_message_count} of transcript"
    return f"{len(turn.sent_messages)} own message(s)"
