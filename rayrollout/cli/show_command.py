"""``rayrollout show``: the command. With ``--task-id`` it prints that task's trajectories as
conversations (``show``); without, it lists the run's episodes one line each
(``episode_list``), filtered and sorted, so the way to an episode starts from the run.

The heavy imports (rich panels, pandas) happen inside the command, so ``rayrollout --help``
stays quick.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rayrollout.cli.common import fail

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["show"]


def show(
    directory: Annotated[Path, typer.Argument(help="Output folder of a run.")],
    task_id: Annotated[
        str | None,
        typer.Option(
            "--task-id",
            help="Task to print as a conversation.",
            show_default="none: list the episodes",
        ),
    ] = None,
    sample: Annotated[
        int | None,
        typer.Option(
            "--sample",
            "--sample-index",
            help="Sample index of --task-id.",
            show_default="every sample",
        ),
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help="Keep these statuses (repeatable): ok, error, timeout, max_turns, truncated, "
            "or 'failed' for every status but ok.",
        ),
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="Keep these environments (repeatable).")
    ] = None,
    min_reward: Annotated[
        float | None, typer.Option("--min-reward", help="Keep rewards of at least this.")
    ] = None,
    max_reward: Annotated[
        float | None, typer.Option("--max-reward", help="Keep rewards of at most this.")
    ] = None,
    sort: Annotated[
        str, typer.Option("--sort", help="List order: task, seconds (slowest first), reward.")
    ] = "task",
    limit: Annotated[
        int, typer.Option("--limit", min=0, help="Episodes listed (0: all); says how many more.")
    ] = 20,
) -> None:
    """List a run's episodes (task id, sample, environment, status, reward, turns, seconds),
    or print one task's trajectories as conversations with --task-id."""
    from rich.console import Console

    from rayrollout.cli.episode_list import filter_episodes, format_lines, sort_episodes
    from rayrollout.data.episode_table import load_episodes

    if task_id is None and sample is not None:
        fail("--sample picks a sample of one task: give --task-id too", 2)
    filters: dict[str, Any] = {
        "statuses": status or (),
        "envs": env or (),
        "min_reward": min_reward,
        "max_reward": max_reward,
    }
    if task_id is not None:
        _print_task(directory, task_id, sample, filters, Console())
        return
    frame = load_episodes(directory)
    matched = filter_episodes(frame, **filters)
    ordered = sort_episodes(matched, sort)
    shown = ordered if limit == 0 else ordered.head(limit)
    for line in format_lines(shown, len(matched), len(frame), directory):
        typer.echo(line)  # lines are data: never wrapped, coloured or read as markup


def _print_task(
    directory: Path, task_id: str, sample: int | None, filters: dict[str, Any], out: Console
) -> None:
    """Print the task's samples that pass the filters; only that task's rows are read (the
    folder's filtered scan), never the whole run."""
    import pandas as pd

    from rayrollout.cli.episode_list import filter_episodes
    from rayrollout.cli.show import find_trajectories, render_trajectory
    from rayrollout.data.run_folder import RunFolder

    found = [
        t
        for t in find_trajectories(directory, task_id)
        if sample is None or t.sample_index == sample
    ]
    keys = ["task_id", "sample_index", "environment", "status", "reward"]
    frame = pd.DataFrame([{k: getattr(t, k) for k in keys} for t in found], columns=keys)
    kept = filter_episodes(frame, **filters)
    found = [t for t, keep in zip(found, frame.index.isin(kept.index), strict=True) if keep]
    if not found:
        which = f"task {task_id!r}" + (f" sample {sample}" if sample is not None else "")
        given = any(value not in (None, ()) for value in filters.values())
        fail(
            f"no trajectory of {which} in {directory}" + (" passes the filters" if given else ""), 1
        )
    stored_as = RunFolder(directory).format
    for trajectory in found:
        render_trajectory(trajectory, out, stored_as)
