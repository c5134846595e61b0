"""``rayrollout show RUN`` without ``--task-id``: the run's episodes one line each, filtered,
sorted and limited, saying how many more there are; ``--task-id`` takes the same filters."""

import pytest
from test_report import end_of, first_call, second_call, write
from typer.testing import CliRunner

from rayrollout.cli.commands import app


@pytest.fixture
def run(tmp_path):
    first = first_call()
    second = second_call(end_of(first))
    write(tmp_path / "run", "parquet", "a", first)
    write(tmp_path / "run", "jsonl", "b", second)
    return tmp_path / "run", first + second


def show(*args):
    result = CliRunner().invoke(app, ["show", *map(str, args)], terminal_width=80)
    return result.exit_code, result.output


def episode_lines(output):
    """``(task id, sample, environment, status, reward, turns, seconds)`` of each listed line."""
    lines = output.splitlines()
    assert lines[0].split() == [
        "task",
        "id",
        "sample",
        "environment",
        "status",
        "reward",
        "turns",
        "seconds",
    ]
    rows = []
    for line in lines[1:]:
        fields = line.split()
        if len(fields) != 7 or not fields[1].isdigit():
            break
        rows.append(fields)
    return rows


def test_every_episode_is_one_line_in_task_order_with_the_rest_counted(run):
    folder, episodes = run
    code, output = show(folder)
    assert code == 0, output
    rows = episode_lines(output)
    assert len(rows) == 20  # the default limit
    ordered = sorted(episodes, key=lambda t: (t.task_id, t.sample_index))
    for fields, t in zip(rows, ordered, strict=False):
        assert fields[:4] == [t.task_id, str(t.sample_index), t.environment, t.status]
        assert float(fields[4]) == pytest.approx(t.reward, abs=5e-4)
        assert int(fields[5]) == t.metrics.turns
        assert float(fields[6]) == pytest.approx(t.metrics.seconds_total, abs=5e-3)
    assert "20 of 36 matching episodes shown; 16 more: --limit 36 (or 0) shows them all" in output
    assert f"open one: rayrollout show {folder} --task-id {ordered[0].task_id} --sample 0" in output


def test_filters_combine_and_the_count_says_what_matched_out_of_the_run(run):
    folder, episodes = run
    code, output = show(folder, "--status", "failed", "--env", "weather", "--limit", "0")
    assert code == 0, output
    wanted = {
        (t.task_id, t.sample_index)
        for t in episodes
        if t.status != "ok" and t.environment == "weather"
    }
    assert {(f[0], int(f[1])) for f in episode_lines(output)} == wanted
    assert f"{len(wanted)} matching episodes (of 36 in the run)" in output

    code, output = show(folder, "--status", "ok", "--min-reward", "0.4", "--max-reward", "0.6")
    wanted = {(t.task_id, t.sample_index) for t in episodes if t.status == "ok" and t.reward == 0.5}
    assert code == 0 and {(f[0], int(f[1])) for f in episode_lines(output)} == wanted
    assert wanted  # the fixture has half rewards

    code, output = show(folder, "--status", "timeout", "--status", "max_turns")
    statuses = {f[3] for f in episode_lines(output)}
    assert code == 0 and statuses == {"timeout", "max_turns"}


def test_sorting_by_seconds_puts_the_slowest_first(run):
    folder, episodes = run
    code, output = show(folder, "--sort", "seconds", "--limit", "3")
    slowest = sorted(episodes, key=lambda t: -t.metrics.seconds_total)[:3]
    assert code == 0
    assert [(f[0], int(f[1])) for f in episode_lines(output)] == [
        (t.task_id, t.sample_index) for t in slowest
    ]


def test_task_id_prints_only_the_samples_that_pass_the_filters(run):
    folder, episodes = run
    failed = next(t for t in episodes if t.status == "error")
    code, output = show(folder, "--task-id", failed.task_id, "--status", "error")
    assert code == 0, output
    assert f"sample {failed.sample_index}" in output and "ZeroDivisionError" in output
    others = [t.sample_index for t in episodes if t.task_id == failed.task_id and t.status == "ok"]
    assert all(f"sample {i}" not in output for i in others)
    code, output = show(folder, "--task-id", failed.task_id, "--sample-index", others[0])
    assert code == 0 and f"sample {others[0]}" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "crashed"], "--status crashed: no such status; use one of"),
        (["--min-reward", "0.9", "--max-reward", "0.1"], "is above --max-reward"),
        (["--sort", "size"], "--sort size: use one of task, seconds, reward"),
        (["--sample", "1"], "--sample picks a sample of one task: give --task-id too"),
    ],
)
def test_a_filter_that_cannot_work_is_one_error_line_with_exit_2(run, args, message):
    folder, _ = run
    code, output = show(folder, *args)
    assert code == 2 and output.startswith("error: ") and message in output, output
    assert "Traceback" not in output


def test_a_filter_matching_nothing_says_so(run):
    folder, _ = run
    code, output = show(folder, "--env", "nowhere")
    assert code == 0 and episode_lines(output) == []
    assert "0 matching episodes (of 36 in the run)" in output
    code, output = show(folder, "--task-id", "t0", "--status", "error")
    assert code == 1 and "no trajectory of task 't0'" in output and "passes the filters" in output
