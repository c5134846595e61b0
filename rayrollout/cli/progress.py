"""Terminal output of a run: a live progress bar and the closing summary table (rich)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from rayrollout.engine.figures import RunSnapshot
from rayrollout.engine.stats import EnvStats

__all__ = ["RunProgress", "summary_table"]


class RunProgress:
    """A progress bar fed with engine snapshots (episodes done, episodes/s, reward, errors).

    Shown from ``begin`` on, not from ``with``: a run knows its episodes only once the engine
    holds the output folder (``resume`` leaves out what is written), and Ray's start-up logs
    should not scroll under a live bar.
    """

    def __init__(self, console: Console, total: int | None = None) -> None:
        self.progress = Progress(
            TextColumn("[bold]episodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>7.1f}/s"),
            TextColumn("reward {task.fields[reward]:.3f}"),
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("in flight {task.fields[in_flight]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            refresh_per_second=4,
        )
        self.task_id = self.progress.add_task(
            "run", total=total, rate=0.0, reward=0.0, errors=0, in_flight=0
        )

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def begin(self, total: int | None) -> None:
        """Show the bar, counting to ``total`` episodes (None: unknown, no bar length)."""
        self.progress.update(self.task_id, total=total)
        self.progress.start()

    def update(self, snapshot: RunSnapshot) -> None:
        total = snapshot.total
        self.progress.update(
            self.task_id,
            completed=total.episodes,
            rate=snapshot.episodes_per_s,
            reward=total.mean_reward,
            errors=total.errors,
            in_flight=snapshot.in_flight,
        )


def summary_table(snapshot: RunSnapshot) -> Table:
    """Per environment: episodes, mean reward, turns, tool calls, p50/p95 seconds, mean
    seconds queued before the start, the share of wall time spent in model / tools / verify
    / other, and statuses; the writer's time in the caption.

    Kept narrow enough for an 80-column terminal: environment names are never cut.
    """
    table = Table(
        title=f"rollout summary ({snapshot.elapsed_s:.1f} s, "
        f"{snapshot.episodes_per_s:.1f} episodes/s)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        caption="queued: mean s waiting for a free slot before the start; time %: share of "
        "episode wall time in model / tools / verify / other" + _writer_line(snapshot),
    )
    table.add_column("environment", no_wrap=True)
    for column in ("episodes", "reward", "turns", "tools", "p50/p95 s", "queued", "time %"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("statuses", min_width=12)
    rows: list[tuple[str, EnvStats]] = list(snapshot.by_env.items())
    rows.append(("total", snapshot.total))
    for name, stats in rows:
        n = max(stats.episodes, 1)
        table.add_row(
            f"[bold]{name}" if name == "total" else name,
            str(stats.episodes),
            f"{stats.mean_reward:.3f}",
            f"{stats.turns / n:.2f}",
            f"{stats.tool_calls / n:.2f}",
            f"{stats.percentile(0.5):.2f}/{stats.percentile(0.95):.2f}",
            f"{stats.mean_queued_s:.2f}",
            "/".join(f"{100 * v:.0f}" for v in stats.time_split().values()),
            _statuses(stats),
        )
    return table


def _statuses(stats: EnvStats) -> str:
    """Statuses with their counts, and sessions that failed to close (their rows say why)."""
    text = ", ".join(f"{k}={v}" for k, v in sorted(stats.statuses.items())) or "-"
    return f"{text}, close failed={stats.close_errors}" if stats.close_errors else text


def _writer_line(snapshot: RunSnapshot) -> str:
    writer = snapshot.writer
    if not writer.parts:
        return ""
    return f"; writer: {writer.rows} rows in {writer.parts} parts, {writer.seconds:.2f} s writing"
