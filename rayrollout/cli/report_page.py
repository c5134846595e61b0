"""The report's HTML: headline figures, tables and episode lists around the plots.

Every headline number sits in an element ``data-figure="<name>" data-value="<exact>"``
(statuses as ``status:<name>``), so a test or a script reads the page's figures without
parsing the text meant for people. Text from rows (task ids, errors, environment names) is
always escaped. The layout is full width: plots scale to the window.
"""

from __future__ import annotations

import html
import shlex
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from rayrollout.cli.report_figures import status_colour
from rayrollout.data.run_summary import PASS_REWARD, RunSummary

__all__ = [
    "LIST_LIMIT",
    "SECTIONS",
    "badge",
    "episode_list",
    "errors_table",
    "headline",
    "page",
    "per_env_table",
    "run_table",
    "segments_table",
    "show_command",
]

SECTIONS = (
    ("run", "The run: model, policy, environments"),
    ("summary", "Per environment"),
    ("throughput", "Throughput over time"),
    ("rewards", "Rewards and pass rate"),
    ("groups", "Reward spread within GRPO groups"),
    ("lengths", "Turns, tool calls and token lengths"),
    ("time", "Episode time, queued time and where it goes"),
    ("versions", "Policy versions"),
    ("status", "Statuses and errors"),
    ("failed", "Failed episodes"),
    ("slowest", "Slowest episodes"),
)
"""``(anchor, heading)`` of every section, in page order."""

LIST_LIMIT = 25
"""Episodes listed per list (failed, slowest); the rest are one ``rayrollout show`` away."""
_ERROR_CHARS = 240

_CSS = """
* { box-sizing: border-box; }
img.thumb { max-width: 96px; max-height: 96px; margin-right: 4px; border: 1px solid #ccc; }
body { font-family: system-ui, sans-serif; margin: 0; padding: 1rem 2rem 3rem; color: #222; }
h1 { margin: 0.2rem 0 0.6rem; font-size: 1.6rem; }
h2 { margin: 0 0 0.6rem; font-size: 1.25rem; border-bottom: 2px solid #e0e0e0; }
nav { position: sticky; top: 0; background: #fafafa; padding: 0.4rem 0; z-index: 1;
      border-bottom: 1px solid #e0e0e0; font-size: 0.9rem; }
nav a { margin-right: 1rem; color: #0d47a1; text-decoration: none; }
section { margin-top: 1.8rem; }
.cards { display: flex; flex-wrap: wrap; gap: 0.6rem; margin: 0.8rem 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.4rem 0.8rem; min-width: 8.5rem;
        background: #fff; }
.card .label { font-size: 0.78rem; color: #666; }
.card .value { font-size: 1.35rem; font-weight: 600; }
img.plot { width: 100%; height: auto; display: block; }
table { border-collapse: collapse; width: 100%; margin: 0.6rem 0; font-size: 0.9rem; }
th, td { padding: 4px 8px; border-bottom: 1px solid #e5e5e5; text-align: right;
         vertical-align: top; }
th { background: #f5f5f5; }
table.kv, table.narrow { width: auto; }
table.narrow th, table.narrow td { padding: 4px 1.5rem; }
 table.kv th { padding-right: 2rem; }
td.text, th.text { text-align: left; }
td.error { text-align: left; color: #8e0000; max-width: 40rem; overflow-wrap: anywhere; }
code { font-family: ui-monospace, monospace; font-size: 0.85rem; }
td code { user-select: all; background: #f3f3f3; padding: 1px 4px; border-radius: 3px;
          white-space: nowrap; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; color: #fff;
         font-size: 0.8rem; margin: 1px 2px; white-space: nowrap; }
.note { color: #555; font-size: 0.9rem; }
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


def _seconds(value: float) -> str:
    """Seconds for people: 0.42 s, 14.6 s, 3.5 min, 2.1 h."""
    if value < 10:
        return f"{value:.2f} s"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _when(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _card(name: str, label: str, value: float | int, text: str) -> str:
    return (
        f'<div class="card" data-figure="{_esc(name)}" data-value="{value!r}">'
        f'<div class="label">{_esc(label)}</div><div class="value">{_esc(text)}</div></div>'
    )


def badge(status: str, count: int | None = None) -> str:
    """A status in its colour (``ok`` green, ``error`` red), with a count if given."""
    text = status if count is None else f"{status} {count}"
    return f'<span class="badge" style="background:{status_colour(status)}">{_esc(text)}</span>'


def headline(summary: RunSummary) -> str:
    """The figures a reader looks for first, as cards carrying their exact values."""
    cards = [
        _card("episodes", "episodes", summary.episodes, f"{summary.episodes:,}"),
        _card("tasks", "tasks", summary.tasks, f"{summary.tasks:,}"),
        _card("mean_reward", "mean reward", summary.mean_reward, f"{summary.mean_reward:.3f}"),
        _card(
            "reward_range",
            "reward range",
            summary.max_reward - summary.min_reward,
            f"{summary.min_reward:g} to {summary.max_reward:g}",
        ),
        _card(
            "pass_rate",
            f"pass rate (reward >= {PASS_REWARD:g})",
            summary.pass_rate,
            f"{summary.pass_rate:.1%}",
        ),
        _card("errors", "not ok", summary.errors, f"{summary.errors:,}"),
        _card("active_s", "duration (active)", summary.active_s, _seconds(summary.active_s)),
        _card(
            "episodes_per_s",
            "episodes/s (active)",
            summary.episodes_per_s,
            f"{summary.episodes_per_s:.2f}",
        ),
        _card("wall_s", "wall span (gaps included)", summary.wall_s, _seconds(summary.wall_s)),
        _card(
            "segments",
            "collect calls / segments",
            len(summary.segments),
            str(len(summary.segments)),
        ),
        _card(
            "mean_queued_s", "mean queued", summary.mean_queued_s, _seconds(summary.mean_queued_s)
        ),
        _card(
            "zero_spread_share",
            "GRPO groups with zero spread",
            summary.groups.zero_spread_share,
            f"{summary.groups.zero_spread_share:.1%}" if summary.groups.groups else "no groups",
        ),
    ]
    statuses = [
        _card(f"status:{status}", f"status {status}", count, f"{count:,}")
        for status, count in summary.statuses.items()
    ]
    return f'<div class="cards">{"".join(cards)}</div><div class="cards">{"".join(statuses)}</div>'


def run_table(directory: Path, summary: RunSummary, rejects: int) -> str:
    """What ran: folder, collect calls, models, policy versions, environments, rejects.

    The output folder keeps no copy of the run's config, so this is read from the rows, and
    the page says so rather than leaving a reader to look for a config section."""
    models = ", ".join(m or "(unset)" for m in summary.models)
    versions = ", ".join(f"{v} ({n:,} episodes)" for v, n in summary.policy_versions.items())
    runs = sorted({run for segment in summary.segments for run in segment.runs})
    start, end = summary.segments[0].start, summary.segments[-1].end
    rows = [
        ("output folder", f"<code>{_esc(directory)}</code>"),
        ("runs (part names)", _esc(", ".join(runs))),
        ("model", _esc(models)),
        ("policy versions", _esc(versions)),
        ("turns across a weight update", f"{summary.turns_across_updates:,}"),
        ("environments", _esc(", ".join(summary.environments))),
        ("first episode queued", _esc(_when(start))),
        ("last episode finished", _esc(_when(end))),
        ("task rows rejected (--skip-invalid)", f"{rejects:,}"),
    ]
    body = "".join(f'<tr><th class="text">{k}</th><td class="text">{v}</td></tr>' for k, v in rows)
    return (
        f'<table class="kv">{body}</table>'
        '<p class="note">The output folder does not keep the run\'s config: model, policy '
        "versions and environments above are read from the rows; the config file given to "
        "<code>rayrollout collect</code> holds the rest.</p>"
    )


def per_env_table(frame: pd.DataFrame) -> str:
    """Per environment: episodes, rewards, lengths, seconds, queued time, statuses."""
    head = (
        "environment",
        "episodes",
        "mean reward",
        "reward range",
        f"pass rate (reward >= {PASS_REWARD:g})",
        "turns/ep",
        "tool calls/ep",
        "prompt tok/ep",
        "completion tok/ep",
        "p50 s",
        "p95 s",
        "mean queued s",
        "statuses",
    )
    rows = []
    for env, rows_of in frame.groupby("environment", sort=True):
        statuses = rows_of["status"].value_counts()
        cells = [
            f'<td class="text">{_esc(env)}</td>',
            f"<td>{len(rows_of):,}</td>",
            f"<td>{rows_of['reward'].mean():.3f}</td>",
            f"<td>{rows_of['reward'].min():g} to {rows_of['reward'].max():g}</td>",
            f"<td>{(rows_of['reward'] >= PASS_REWARD).mean():.1%}</td>",
            f"<td>{rows_of['m_turns'].mean():.2f}</td>",
            f"<td>{rows_of['m_tool_calls'].mean():.2f}</td>",
            f"<td>{rows_of['m_tokens_in'].mean():,.0f}</td>",
            f"<td>{rows_of['m_tokens_out'].mean():,.0f}</td>",
            f"<td>{rows_of['m_seconds_total'].quantile(0.5):.3f}</td>",
            f"<td>{rows_of['m_seconds_total'].quantile(0.95):.3f}</td>",
            f"<td>{rows_of['m_seconds_queued'].mean():.3f}</td>",
            '<td class="text">' + "".join(badge(s, int(n)) for s, n in statuses.items()) + "</td>",
        ]
        rows.append(f'<tr data-env="{_esc(env)}">{"".join(cells)}</tr>')
    header = "".join(
        f'<th class="text">{h}</th>' if h in ("environment", "statuses") else f"<th>{h}</th>"
        for h in head
    )
    return f"<table><tr>{header}</tr>{''.join(rows)}</table>"


def segments_table(summary: RunSummary) -> str:
    """One line per segment (collect call, or stretch of one): when, how long, how fast."""
    rows = []
    for number, s in enumerate(summary.segments):
        rows.append(
            f'<tr data-segment="{number}" data-episodes="{s.episodes}" '
            f'data-seconds="{s.seconds!r}">'
            f'<td>{number + 1}</td><td class="text">{_esc(", ".join(s.runs))}</td>'
            f'<td class="text">{_esc(_when(s.start))}</td>'
            f"<td>{_seconds(s.gap_before_s) if number else '-'}</td>"
            f"<td>{s.episodes:,}</td><td>{_seconds(s.seconds)}</td>"
            f"<td>{s.episodes_per_s:.2f}</td></tr>"
        )
    return (
        '<table><tr><th>#</th><th class="text">run</th><th class="text">first queued</th>'
        "<th>gap before</th><th>episodes</th><th>duration</th><th>episodes/s</th></tr>"
        f"{''.join(rows)}</table>"
        '<p class="note">Duration runs from a segment\'s first episode queued in the engine '
        "to its last one finished (engine start-up is not in the rows, so it is not counted); "
        "a new segment begins with a new collect call or after more than a second with "
        "nothing queued or running.</p>"
    )


def errors_table(frame: pd.DataFrame) -> str:
    """Per environment and status that is not ok: how many, and one example error."""
    failed = frame[frame["status"] != "ok"]
    if failed.empty:
        return "<p>Every episode ended with status <code>ok</code>.</p>"
    rows = []
    for (env, status), rows_of in failed.groupby(["environment", "status"], sort=True):
        errors = rows_of["error"].dropna()
        example = errors.iloc[0] if len(errors) else ""
        rows.append(
            f'<tr><td class="text">{_esc(env)}</td><td class="text">{badge(str(status))}</td>'
            f"<td>{len(rows_of):,}</td>"
            f'<td class="error">{_esc(_shorten(example))}</td></tr>'
        )
    return (
        '<table><tr><th class="text">environment</th><th class="text">status</th>'
        f'<th>episodes</th><th class="text">example error</th></tr>{"".join(rows)}</table>'
    )


def _shorten(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


def show_command(directory: Path, task_id: str, sample_index: int) -> str:
    """The command that prints one episode as a conversation."""
    return (
        f"rayrollout show {shlex.quote(str(directory))} --task-id {shlex.quote(task_id)} "
        f"--sample {sample_index}"
    )


def episode_list(
    directory: Path,
    rows: pd.DataFrame,
    total: int,
    more_command: str,
    kind: str,
    thumbnails: dict[tuple[str, int], list[str]] | None = None,
) -> str:
    """A table of episodes, each with the ``rayrollout show`` command that opens it.

    ``total`` is how many episodes the list stands for; past the rows shown, the page says
    how many more there are and gives ``more_command``, which lists them all. With
    ``thumbnails`` (data URLs by ``(task_id, sample_index)``) that hold any, an images
    column shows them.
    """
    if total == 0:
        return f"<p>No {kind} episodes.</p>"
    lines = []
    shown = {key: urls for key, urls in (thumbnails or {}).items() if urls}
    for row in rows.itertuples(index=False):
        command = show_command(directory, str(row.task_id), int(row.sample_index))
        images = ""
        if shown:
            urls = shown.get((str(row.task_id), int(row.sample_index)), [])
            images = (
                '<td class="text">'
                + "".join(
                    f'<img class="thumb" src="{_esc(url)}" alt="image {n} of the episode">'
                    for n, url in enumerate(urls, start=1)
                )
                + "</td>"
            )
        lines.append(
            f'<tr data-task-id="{_esc(row.task_id)}" data-sample-index="{int(row.sample_index)}">'
            f'<td class="text">{badge(str(row.status))}</td>'
            f'<td class="text">{_esc(row.environment)}</td>'
            f'<td class="text">{_esc(row.task_id)}</td><td>{int(row.sample_index)}</td>'
            f"<td>{float(row.reward):.3f}</td><td>{int(row.m_turns)}</td>"
            f"<td>{float(row.m_seconds_total):.2f}</td>"
            f'<td class="error">{_esc(_shorten(row.error)) if isinstance(row.error, str) else ""}'
            f'</td>{images}<td class="text"><code>{_esc(command)}</code></td></tr>'
        )
    more = ""
    if total > len(rows):
        more = (
            f'<p class="note">{total - len(rows):,} more {kind + " " if kind else ""}episodes '
            "not listed; "
            f"<code>{_esc(more_command)}</code> lists them all.</p>"
        )
    return (
        '<table><tr><th class="text">status</th><th class="text">environment</th>'
        '<th class="text">task</th><th>sample</th><th>reward</th><th>turns</th><th>seconds</th>'
        '<th class="text">error</th>'
        + ('<th class="text">images</th>' if shown else "")
        + '<th class="text">open it</th></tr>'
        f"{''.join(lines)}</table>{more}"
    )


def page(title: str, headline_html: str, sections: dict[str, str]) -> str:
    """The whole document: title, headline, a link bar and every section of ``SECTIONS``."""
    links = "".join(f'<a href="#{anchor}">{_esc(h.split(":")[0])}</a>' for anchor, h in SECTIONS)
    body = "".join(
        f'<section id="{anchor}"><h2>{_esc(heading)}</h2>{sections[anchor]}</section>'
        for anchor, heading in SECTIONS
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(title)}</title><style>{_CSS}</style></head><body>
<h1>{_esc(title)}</h1>
<nav>{links}</nav>
<section id="headline">{headline_html}</section>
{body}
</body></html>
"""
