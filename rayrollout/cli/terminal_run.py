"""A collect run shown on a terminal: its plan and checks first, then progress and summary.

``run_collect`` is what ``rayrollout collect`` and ``rayrollout demo`` do with a config: the
API plans and checks it before Ray starts (a mistake is one line and exit 2), then one
``RolloutEngine.collect`` runs it while the terminal shows skipped rows, a bar and a summary.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from rayrollout.cli.common import console

# The API, the config and the output folder (Ray, pydantic, pyarrow) load when a command
# runs, not when the app is built: `rayrollout --help` imports none of them.
if TYPE_CHECKING:
    from rayrollout.api.collect import CollectPlan
    from rayrollout.data.config import RunConfig
    from rayrollout.engine.run_figures import RunSnapshot

__all__ = ["run_collect", "sigterm_as_interrupt"]


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

    engine = RolloutEngine(config, policy=plan.policy)  # the kind as the plan checked it
    progress = RunProgress(console)
    planned: list[CollectPlan] = []

    def show_plan(plan: CollectPlan) -> None:
        # Again now that Ray is up: ray.init installs its own SIGTERM handler (it prints a
        # stack and dies with rc 15), which would skip the flush of finished episodes.
        signal.signal(signal.SIGTERM, sigterm_as_interrupt)
        planned.append(plan)
        for exc, _ in plan.rejects[:MAX_ERRORS_SHOWN]:
            console.print(f"[yellow]skipped[/yellow] {escape(str(exc))}", highlight=False)
        plan.on_reject = skipped
        if engine.config.resume:
            console.print(
                f"resume: {len(plan.written)} episode(s) already in {engine.config.output.dir}",
                soft_wrap=True,  # unwrapped: the path stays whole, to copy
            )
        console.print(
            f"policy: {engine.policy_url} ({engine.config.policy.model}); "
            f"workers: {config.workers.num_workers}; concurrency: {config.concurrency}",
            soft_wrap=True,  # unwrapped: the URL stays whole, to copy
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
        console.print(
            f"{rejects} invalid row(s) skipped; see {out_dir / REJECTS_FILE}", soft_wrap=True
        )
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


def sigterm_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (a scheduler's stop, ``kill``) ends the run as Ctrl-C does: finished episodes
    are written, then exit 130, and ``--resume`` completes the run."""
    raise KeyboardInterrupt
