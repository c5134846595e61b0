"""``rayrollout report``: one self-contained HTML page describing a run's output folder.

Sections: reward distribution and pass rate per environment, turns and tool calls per
episode, episode time and where it goes, statuses with example errors, throughput over time.
Plots are drawn with matplotlib and embedded as PNG data URIs, so the page is one file that
opens anywhere. Only the columns the report needs are read, so large runs stay cheap.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import pandas as pd

from rayrollout.data.run_folder import RunFolder

__all__ = ["SECTIONS", "load_run", "render_report"]

SECTIONS = (
    ("rewards", "Reward distribution per environment"),
    ("pass-rate", "Pass rate per environment"),
    ("turns", "Turns and tool calls per episode"),
    ("time", "Episode time and where it goes"),
    ("status", "Statuses and errors"),
    ("throughput", "Throughput over time"),
)
_COLUMNS = [
    "task_id",
    "sample_index",
    "environment",
    "reward",
    "status",
    "error",
    "metrics",
    "created_at",
]


def load_run(directory: str | Path) -> pd.DataFrame:
    """The report's columns of every part in an output folder (both formats), metrics
    flattened."""
    folder = RunFolder(directory)
    if not folder.parts():
        raise FileNotFoundError(f"no part files (part-*.parquet or part-*.jsonl) in {folder.path}")
    frame = folder.table(_COLUMNS).to_pandas()
    metrics = pd.json_normalize(frame.pop("metrics").tolist())
    return pd.concat([frame.reset_index(drop=True), metrics.add_prefix("m_")], axis=1)


def _figure_html(figure: object, alt: str) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")  # type: ignore[attr-defined]
    import matplotlib.pyplot as plt

    plt.close(figure)  # type: ignore[arg-type]
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _plots(frame: pd.DataFrame) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted(frame["environment"].unique())
    by_env = frame.groupby("environment")
    out: dict[str, str] = {}

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.hist([by_env.get_group(e)["reward"] for e in envs], bins=10, range=(0, 1), label=envs)
    ax.set_xlabel("reward")
    ax.set_ylabel("episodes")
    ax.legend()
    out["rewards"] = _figure_html(fig, "reward histogram per environment")

    fig, ax = plt.subplots(figsize=(7, 3.2))
    pass_rate = by_env["reward"].apply(lambda r: (r >= 1.0).mean())
    ax.bar(pass_rate.index, pass_rate.values)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share with reward 1")
    out["pass-rate"] = _figure_html(fig, "pass rate per environment")

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, column, label in (
        (axes[0], "m_turns", "turns"),
        (axes[1], "m_tool_calls", "tool calls"),
    ):
        ax.hist([by_env.get_group(e)[column] for e in envs], label=envs)
        ax.set_xlabel(f"{label} per episode")
    axes[0].legend()
    out["turns"] = _figure_html(fig, "turns and tool calls per episode")

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    axes[0].hist([by_env.get_group(e)["m_seconds_total"] for e in envs], bins=30, label=envs)
    axes[0].set_xlabel("episode seconds")
    axes[0].legend()
    parts = by_env[
        ["m_seconds_model", "m_seconds_tools", "m_seconds_verify", "m_seconds_total"]
    ].sum()
    other = (
        parts["m_seconds_total"]
        - parts[["m_seconds_model", "m_seconds_tools", "m_seconds_verify"]].sum(axis=1)
    ).clip(lower=0)
    bottom = pd.Series(0.0, index=parts.index)
    for column, label in (
        ("m_seconds_model", "model"),
        ("m_seconds_tools", "tools"),
        ("m_seconds_verify", "verify"),
    ):
        axes[1].bar(parts.index, parts[column], bottom=bottom, label=label)
        bottom += parts[column]
    axes[1].bar(parts.index, other, bottom=bottom, label="other")
    axes[1].set_ylabel("seconds, summed over episodes")
    axes[1].legend()
    out["time"] = _figure_html(fig, "episode time distribution and split")

    fig, ax = plt.subplots(figsize=(7, 3.2))
    statuses = frame.groupby(["environment", "status"]).size().unstack(fill_value=0)
    statuses.plot.bar(ax=ax, stacked=True)
    ax.set_ylabel("episodes")
    out["status"] = _figure_html(fig, "statuses per environment")

    fig, ax = plt.subplots(figsize=(7, 3.2))
    finished = frame["created_at"].sort_values()
    per_second = finished.dt.floor("s").value_counts().sort_index()
    ax.plot((per_second.index - finished.iloc[0]).total_seconds(), per_second.values)
    ax.set_xlabel("seconds since the first episode finished")
    ax.set_ylabel("episodes/s")
    out["throughput"] = _figure_html(fig, "throughput over time")
    return out


def _summary_table(frame: pd.DataFrame) -> str:
    grouped = frame.groupby("environment")
    table = pd.DataFrame(
        {
            "episodes": grouped.size(),
            "mean reward": grouped["reward"].mean().round(3),
            "pass rate": grouped["reward"].apply(lambda r: (r >= 1.0).mean()).round(3),
            "turns/ep": grouped["m_turns"].mean().round(2),
            "tool calls/ep": grouped["m_tool_calls"].mean().round(2),
            "p50 s": grouped["m_seconds_total"].quantile(0.5).round(3),
            "p95 s": grouped["m_seconds_total"].quantile(0.95).round(3),
        }
    )
    return table.to_html(classes="summary", border=0)


def _errors_table(frame: pd.DataFrame) -> str:
    failed = frame[frame["status"] != "ok"]
    if failed.empty:
        return "<p>Every episode ended with status <code>ok</code>.</p>"
    counts = failed.groupby(["environment", "status"]).size().rename("episodes").reset_index()
    examples = (
        failed.dropna(subset=["error"])
        .groupby(["environment", "status"])["error"]
        .first()
        .rename("example error")
        .reset_index()
    )
    merged = counts.merge(examples, on=["environment", "status"], how="left")
    return merged.to_html(index=False, border=0, classes="errors")


def render_report(directory: str | Path, title: str | None = None) -> str:
    """The report page for an output folder, as one HTML string."""
    frame = load_run(directory)
    plots = _plots(frame)
    seconds = (frame["created_at"].max() - frame["created_at"].min()).total_seconds()
    rate = len(frame) / seconds if seconds > 0 else float("nan")
    title = title or f"rayrollout report: {Path(directory).name}"
    sections = []
    for anchor, heading in SECTIONS:
        extra = _errors_table(frame) if anchor == "status" else ""
        sections.append(
            f'<section id="{anchor}"><h2>{heading}</h2>{plots[anchor]}{extra}</section>'
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 960px; color: #222; }}
table {{ border-collapse: collapse; margin: 1rem 0; }}
th, td {{ padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: right; }}
section {{ margin-top: 2rem; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{len(frame)} episodes, {frame["task_id"].nunique()} tasks, {rate:.1f} episodes/s
over {seconds:.1f} s, mean reward {frame["reward"].mean():.3f}.</p>
<section id="summary"><h2>Summary per environment</h2>{_summary_table(frame)}</section>
{"".join(sections)}
</body></html>
"""
