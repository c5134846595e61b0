import pytest
from rich.console import Console

from rayrollout.cli.progress import summary_table
from rayrollout.data.schema import EpisodeMetrics, Trajectory
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import RunStats


def row(env, reward, status="ok", model=0.5, tools=0.25, verify=0.05, total=1.0):
    metrics = EpisodeMetrics(
        turns=2,
        tool_calls=1,
        seconds_model=model,
        seconds_tools=tools,
        seconds_verify=verify,
        seconds_total=total,
    )
    return Trajectory(
        task_id="t",
        sample_index=0,
        group_id="t",
        environment=env,
        reward=reward,
        status=status,
        metrics=metrics,
    ).to_row()


def test_figures_per_environment_and_in_total():
    stats = RunStats()
    stats.add([row("math", 1.0), row("math", 0.0, status="error"), row("weather", 1.0)])
    snapshot = stats.snapshot()
    assert snapshot["total"]["episodes"] == 3
    assert snapshot["by_env"]["math"]["statuses"] == {"ok": 1, "error": 1}
    assert stats.by_env["math"].mean_reward == 0.5
    assert stats.total.errors == 1


def test_time_split_says_where_episode_time_goes():
    stats = RunStats()
    stats.add([row("math", 1.0), row("math", 1.0)])
    split = stats.total.time_split()
    assert split == pytest.approx({"model": 0.5, "tools": 0.25, "verify": 0.05, "other": 0.2})


def test_summary_table_has_a_row_per_environment_and_a_total():
    stats = RunStats()
    stats.add([row("math", 1.0), row("weather", 0.0)])
    table = summary_table(RunSnapshot(**stats.snapshot()))
    assert table.row_count == 3
    assert "time %" in [c.header for c in table.columns]
    console = Console(width=80, record=True)
    console.print(table)
    text = console.export_text()
    assert "weather" in text and "math" in text  # names are never cut at 80 columns


def test_sessions_that_failed_to_close_are_counted_beside_the_statuses():
    failed_close = {**row("a", 1.0), "close_error": "NemoGymError: HTTP 500 to /close_session"}
    stats = RunStats()
    stats.add([failed_close, row("a", 1.0), row("b", 1.0)])
    summary = stats.summary()
    assert summary["close_errors"] == 1 and summary["errors"] == 0
    assert summary["by_env"]["a"]["close_errors"] == 1
    assert summary["by_env"]["b"]["close_errors"] == 0
    console = Console(width=200, record=True)
    console.print(summary_table(RunSnapshot(**{**stats.snapshot(), "episodes_per_s": 1.0})))
    text = console.export_text()
    assert text.count("close failed=1") == 2  # environment a, and the total
