"""Terminal output of a run: a live progress bar and the closing summary table (rich).

Both fit an 80-column terminal without cutting a figure: the bar's optional parts (episodes
in flight) show only where there is room, and the table keeps to the figures a reader
compares across environments, listing statuses other than ``ok`` only. Rewards are any
finite float, shown as they are (``reward_text``: -1.000, 3.000; -1.235e+05 past 9999).
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from rayrollout.cli.console_log import logs_routed
from rayrollout.cli.failures import failed_count
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import EnvStats

__all__ = ["RunProgress", "reward_text", "summary_table"]


class RunProgress:
    """A progress bar fed with engine snapshots (episodes done, episodes/s, reward, and the
    episodes that failed: ``error`` or ``timeout``, as the closing summary counts them; a
    ``max_turns`` or ``truncated`` episode is verified and scored, not failed).

    Shown from ``begin`` on, not from ``with``: a run knows its episodes only once the engine
    holds the output folder (``resume`` leaves out what is written), and Ray's start-up logs
    should not scroll under a live bar.

    Args:
        console: Where the bar is drawn.
        total: Episodes to count to, if known already.
        redirect: Print what is written to ``sys.stdout``/``sys.stderr`` above the bar (rich's
            redirection). Default: only when the run's logs are not routed to their file
            (``console_log``); redirected, they would reach the console after all.
    """

    def __init__(
        self, console: Console, total: int | None = None, redirect: bool | None = None
    ) -> None:
        redirect = not logs_routed() if redirect is None else redirect
        wide = console.width >= _WIDE
        columns: list[ProgressColumn] = [
            TextColumn("[bold]episodes"),
            # What the other columns leave at their widest (10000/10000 episodes, 4-digit
            # failed), so the line never wraps or cuts a figure.
            BarColumn(bar_width=max(4, min(40, console.width - (84 if wide else 72)))),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:.1f}/s"),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("failed {task.fields[failed]}"),
        ]
        if wide:
            columns.append(TextColumn("in flight {task.fields[in_flight]}"))
        columns += [TimeElapsedColumn(), TimeRemainingColumn()]
        self.progress = Progress(
            *columns,
            console=console,
            refresh_per_second=4,
            redirect_stdout=redirect,
            redirect_stderr=redirect,
        )
        self.task_id = self.progress.add_task(
            "run", total=total, rate=0.0, reward=reward_text(0.0), failed=0, in_flight=0
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
            reward=reward_text(total.mean_reward),
            failed=failed_count(total),
            in_flight=snapshot.in_flight,
        )


_WIDE = 100
"""Console columns from which the bar also shows the episodes in flight."""


def summary_table(snapshot: RunSnapshot) -> Table:
    """Per environment: episodes, mean reward, turns, tool calls, p50/p95 seconds, the share
    of wall time spent in model / tools / verify / other, and the statuses other than ok;
    the mean wait for a free slot and the writer's time in the caption.

    Kept within 80 columns: numbers never wrap or get cut, and the two text columns
    (environment names, statuses) fold onto a second line rather than lose characters.
    """
    table = Table(
        title=f"rollout summary ({snapshot.elapsed_s:.1f} s, "
        f"{snapshot.episodes_per_s:.1f} episodes/s)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=0,  # the box's blank between columns is the gap: 2 would need 87 columns
        caption="time %: share of episode wall time in model / tools / verify / other; "
        f"queued: {snapshot.total.mean_queued_s:.2f} s mean wait for a free slot"
        + _writer_line(snapshot),
        caption_justify="left",
    )
    rows: list[tuple[str, EnvStats]] = list(snapshot.by_env.items())
    rows.append(("total", snapshot.total))
    longest = max(len(name) for name, _ in rows)
    # Squeezed, a text column folds to its minimum: the header stays whole, and a name
    # folds only past 15 characters.
    table.add_column("environment", overflow="fold", min_width=max(11, min(longest, 15)))
    for column in ("episodes", "reward", "turns", "tools", "p50/p95 s", "time %"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("not ok", overflow="fold", min_width=12)
    for name, stats in rows:
        n = max(stats.episodes, 1)
        table.add_row(
            f"[bold]{name}" if name == "total" else name,
            str(stats.episodes),
            reward_text(stats.mean_reward),
            f"{stats.turns / n:.2f}",
            f"{stats.tool_calls / n:.2f}",
            f"{_seconds(stats.percentile(0.5))}/{_seconds(stats.percentile(0.95))}",
            "/".join(f"{100 * v:.0f}" for v in stats.time_split().values()),
            _statuses(stats),
        )
    return table


def reward_text(value: float) -> str:
    """A reward as the bar and the table show it: three decimals, or four significant
    digits with an exponent past 9999 (at most 11 characters, so the table keeps 80 columns)."""
    return f"{value:.3f}" if abs(value) < 10_000 else f"{value:.3e}"


def _seconds(value: float) -> str:
    """Three significant digits at most (0.12, 2.28, 10.6, 123), so p50/p95 stays narrow."""
    if value < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _statuses(stats: EnvStats) -> str:
    """Statuses other than ok with their counts, and sessions that failed to close (their
    rows say why); ``-`` when every episode ended ok."""
    others = [f"{k}={v}" for k, v in sorted(stats.statuses.items()) if k != "ok"]
    if stats.close_errors:
        others.append(f"close failed={stats.close_errors}")
    return ", ".join(others) or "-"


def _writer_line(snapshot: RunSnapshot) -> str:
    writer = snapshot.writer
    if not writer.parts:
        return ""
    return f"; writer: {writer.rows} rows in {writer.parts} parts, {writer.seconds:.2f} s writing"
