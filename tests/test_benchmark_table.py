"""The docs' benchmark figures can be trusted: full runs only, pooled, judged on the pool.

The table (``benchmarks/table.py``, written by ``docs/gen_reference.py``) is rendered here
from result files written into a temporary folder, and the committed page and results are
checked as they stand: a smoke run never stands as the latest, a measured figure is judged
only over at least ``MIN_RUNS`` runs and on their median, and the noise floor stands beside
the ratios it bounds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
sys.path.insert(0, str(BENCHMARKS))

import result_files  # noqa: E402
import table  # noqa: E402
from targets import MIN_RUNS, TARGETS, Target, meets, pool  # noqa: E402

RATIO = Target("bench", "engine / bare", "ratio", ">= 0.9", noise_floor="bench_noise_floor")
LOST = Target("bench", "rows lost", "lost", "== 0")


def write_series(folder: Path, name: str, records: list[dict], smoke: bool = False) -> None:
    """A result file as ``result_files.save_result`` and ``--runs`` write it."""
    command = f"python benchmarks/{name}.py" + (" --smoke" if smoke else "")
    runs = [{"command": command, **record} for record in records]
    suffix = ".smoke" if smoke else ""
    (folder / f"{name}{suffix}.json").write_text(
        json.dumps({"command": command, "smoke": smoke, "runs": runs})
    )


def split_row(line: str) -> list[str]:
    """A Markdown table row's cells (an escaped pipe stays inside its cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def row(lines: list[str], figure: str) -> list[str]:
    """The cells of the table row whose figure is ``figure``."""
    for line in lines:
        cells = split_row(line)
        if len(cells) > 1 and cells[1] == figure:
            return cells
    raise AssertionError(f"no row for {figure!r} in {lines}")


COLUMNS = ("benchmark", "figure", "target", "pooled", "spread", "runs", "met", "noise", "by")


def cells(lines: list[str], figure: str) -> dict[str, str]:
    return dict(zip(COLUMNS, row(lines, figure), strict=True))


def test_a_smoke_run_is_never_shown_and_the_row_names_the_command_to_measure(tmp_path):
    write_series(tmp_path, "bench", [{"ratio": 0.97}], smoke=True)
    found = cells(table.targets_table(tmp_path, (RATIO,)), "engine / bare")
    assert found["pooled"] == "no full run yet"
    assert "0.97" not in " ".join(table.targets_table(tmp_path, (RATIO,)))
    assert found["met"] == "not judged"
    assert found["by"] == f"`python benchmarks/bench.py --runs {MIN_RUNS}`"


def test_a_full_result_holding_a_smoke_run_is_refused(tmp_path):
    write_series(tmp_path, "bench", [{"ratio": 0.97}], smoke=True)
    (tmp_path / "bench.smoke.json").rename(tmp_path / "bench.json")
    refused = r"runs\[0\].*smoke run in a full result"
    with pytest.raises(result_files.ResultFileError, match=refused):
        table.targets_table(tmp_path, (RATIO,))


def test_a_result_in_the_single_record_form_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"command": "x", "ratio": 1.0}))
    with pytest.raises(result_files.ResultFileError, match="rerun the benchmark"):
        table.targets_table(tmp_path, (RATIO,))


@pytest.mark.parametrize("runs", [[0.97], [0.97, 0.99]])
def test_a_ratio_with_fewer_than_the_needed_runs_is_not_judged(tmp_path, runs):
    write_series(tmp_path, "bench", [{"ratio": r} for r in runs])
    found = cells(table.targets_table(tmp_path, (RATIO,)), "engine / bare")
    assert found["met"] == f"not judged: {len(runs)} of {MIN_RUNS} runs"
    assert found["runs"] == str(len(runs))


@pytest.mark.parametrize(
    ("runs", "pooled", "met"),
    [
        ([0.5, 0.95, 0.96], "0.95", "yes"),  # the median clears it (the mean, 0.80, would not)
        ([0.85, 0.88, 1.2], "0.88", "**no**"),  # the best run clears it, the median does not
        ([0.91, 0.89, 0.93, 0.5, 0.99], "0.91", "yes"),
    ],
)
def test_met_is_decided_on_the_median_of_the_runs_beside_the_lowest_and_highest(
    tmp_path, runs, pooled, met
):
    write_series(tmp_path, "bench", [{"ratio": r} for r in runs])
    found = cells(table.targets_table(tmp_path, (RATIO,)), "engine / bare")
    assert (found["pooled"], found["met"]) == (pooled, met)
    assert found["spread"] == f"{table.figure(min(runs))} – {table.figure(max(runs))}"


def test_an_exact_count_must_hold_in_every_run_and_one_run_shows_it(tmp_path):
    write_series(tmp_path, "bench", [{"lost": 0}])
    assert cells(table.targets_table(tmp_path, (LOST,)), "rows lost")["met"] == "yes"
    write_series(tmp_path, "bench", [{"lost": 0}, {"lost": 2}, {"lost": 0}])
    found = cells(table.targets_table(tmp_path, (LOST,)), "rows lost")
    assert (found["pooled"], found["met"]) == ("2", "**no**")


def test_the_noise_floor_stands_beside_the_ratio_it_bounds(tmp_path):
    write_series(tmp_path, "bench", [{"ratio": r} for r in (0.92, 0.95, 0.93)])
    write_series(tmp_path, "bench_noise_floor", [{"ratio": r} for r in (0.98, 1.04, 1.01)])
    found = cells(table.targets_table(tmp_path, (RATIO,)), "engine / bare")
    assert found["noise"] == "1.01 (0.98 – 1.04), 3 runs"


def test_a_figure_without_a_goal_is_reported_not_judged(tmp_path):
    write_series(tmp_path, "bench", [{"ratio": 2.0}] * 3)
    found = cells(table.targets_table(tmp_path, (Target("bench", "plain", "ratio"),)), "plain")
    assert (found["pooled"], found["met"]) == ("2", "—")


def test_pool_refuses_no_runs_and_a_goal_it_cannot_read():
    with pytest.raises(ValueError, match="at least one run"):
        pool([], ">= 1")
    with pytest.raises(ValueError, match="'>= X'"):
        meets(1.0, "> 1")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("engine_inline.ratio_steady", 0.93),
        ("runs[concurrency=2048].efficiency", 0.5),
        ("rss_mb.*.growth", 49.0),
        ("help.rayrollout --help.median_s", 0.26),
    ],
)
def test_a_benchmark_figure_is_read_from_its_result(field, value):
    result = {
        "engine_inline": {"ratio_steady": 0.93},
        "runs": [{"concurrency": 64, "efficiency": 0.9}, {"concurrency": 2048, "efficiency": 0.5}],
        "rss_mb": {"engine": {"growth": 49.0}, "driver": {"growth": 2.0}},
        "help": {"rayrollout --help": {"median_s": 0.26}},
    }
    assert table.lookup(result, field) == value


def test_a_missing_figure_is_a_key_error_and_goals_compare():
    with pytest.raises(KeyError):
        table.lookup({"runs": []}, "runs[concurrency=8192].efficiency")
    assert meets(0.93, ">= 0.9") and not meets(0.85, ">= 0.9")
    assert meets(4.2, "<= 5") and meets(0, "== 0")


def test_every_target_names_a_benchmark_that_exists():
    for target in TARGETS:
        script = target.measured_by.split()[1]  # python benchmarks/<script>.py [options]
        assert (ROOT / script).exists(), target
        if target.goal:
            meets(0.0, target.goal)  # a goal that parses


def test_every_kept_result_is_a_series_and_no_full_result_holds_a_smoke_run():
    for path in sorted(RESULTS.glob("*.json")):
        series = result_files.read_series(path)  # refuses a smoke run in a full result
        assert series["command"].startswith("python benchmarks/"), path


def test_the_committed_page_judges_no_measured_figure_on_fewer_than_the_needed_runs():
    page = (ROOT / "docs" / "reference" / "benchmarks.md").read_text().splitlines()
    rows = [line for line in page if line.startswith("| ") and not line.startswith("| ---")][1:]
    assert rows, "the benchmarks page has no table"
    goals = {(t.benchmark, t.figure.replace("|", "\\|")): t.goal for t in TARGETS}
    for line in rows:
        found = dict(zip(COLUMNS, split_row(line), strict=True))
        assert "smoke" not in found["pooled"], line
        goal = goals.get((found["benchmark"], " ".join(found["figure"].split())))
        if found["met"] in ("yes", "**no**") and not (goal or "").startswith("=="):
            assert int(found["runs"]) >= MIN_RUNS, line


def test_the_scaling_table_shows_each_node_count_pooled_over_the_runs(tmp_path):
    def run(rate: float) -> dict:
        points = [
            {
                "nodes": n,
                "episodes_per_s": rate * n,
                "cpu_ms_per_episode": {"workers": 1.0, "engine actor": 0.2, "driver": 0.1},
                "engine_side_cpu_ms_per_episode": 1.5,
                "engine_actor_share": 0.133,
                "engine_actor_saturates_at_episodes_per_s": 5000,
            }
            for n in (1, 2, 4)
        ]
        return {"episodes": 100, "concurrency": 8, "workers_per_node": 1, "points": points}

    assert "No full run" in table.scaling_table(tmp_path)[0]
    write_series(tmp_path, "scaling", [run(100.0), run(300.0), run(200.0)])
    lines = table.scaling_table(tmp_path)
    four = next(line for line in lines if line.startswith("| 4 |"))
    assert four.startswith("| 4 | 800 (400 – 1,200) | 1 (1 – 1) | 0.2 (0.2 – 0.2) |"), four
    assert "3 runs" in lines[0]


def run_three_times(tmp_path: Path, main: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``benchmarks/tiny.py`` (``main`` its ``main``'s body, with ``emit`` imported) run with
    ``arguments`` (default ``--runs 3``), its results kept in ``tmp_path/results``."""
    script = tmp_path / "tiny.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "from common import emit\n"
        "from result_files import run_benchmark\n"
        "def main():\n"
        f"    {main}\n"
        "run_benchmark(main)\n"
    )
    env = {**os.environ, result_files.RESULTS_ENV: str(tmp_path / "results")}
    command = [sys.executable, str(script), *(arguments or ("--runs", "3"))]
    return subprocess.run(command, env=env, capture_output=True, text=True)


def test_runs_keeps_n_runs_of_one_command_as_one_series(tmp_path):
    results = tmp_path / "results"
    done = run_three_times(tmp_path, "emit({'benchmark': 'tiny', 'ratio': 1.0})")
    assert done.returncode == 0, done.stderr
    series = result_files.read_series(results / "tiny.json")
    assert series["command"] == "python benchmarks/tiny.py --runs 3"
    assert [r["command"] for r in series["runs"]] == ["python benchmarks/tiny.py"] * 3
    assert json.loads(done.stdout) == series  # stdout holds the one series


def test_a_failed_run_of_a_series_keeps_no_run_and_says_so(tmp_path):
    results = tmp_path / "results"
    done = run_three_times(tmp_path, "raise SystemExit(3)")
    assert done.returncode != 0
    assert "run 1 of 3 failed (exit 3); no run of this series is kept" in done.stderr
    assert not results.exists() or not list(results.glob("*.json"))


def test_one_run_never_replaces_a_series_of_several_and_says_where_it_went(tmp_path):
    results = tmp_path / "results"
    assert run_three_times(tmp_path, "emit({'benchmark': 'tiny', 'ratio': 1.0})").returncode == 0
    one = run_three_times(tmp_path, "emit({'benchmark': 'tiny', 'ratio': 0.5})", "--fast")
    assert one.returncode == 0, one.stderr
    kept = result_files.read_series(results / "tiny.json")
    assert [r["ratio"] for r in kept["runs"]] == [1.0] * 3  # the series stands
    beside = result_files.read_series(results / "tiny.single.json")
    assert beside["command"] == "python benchmarks/tiny.py --fast"
    assert [r["ratio"] for r in beside["runs"]] == [0.5]
    assert "keeps a series of 3 runs" in one.stderr and "tiny.single.json" in one.stderr
    assert not any("tiny.single" in line for line in table.targets_table(results))


def test_each_run_of_a_series_follows_the_same_run_of_the_series_it_replaces(tmp_path):
    """What a benchmark keeps from its earlier result (``task_scale.py --cases``) stays as
    many runs as were measured: run i of a series reads run i of the one it replaces."""
    results = tmp_path / "results"
    results.mkdir()
    write_series(
        results, "tiny", [{"benchmark": "tiny", "mine": 1}, {"benchmark": "tiny", "mine": 2}]
    )
    main = (
        "from result_files import earlier_record; earlier = earlier_record('tiny', False); "
        "emit({'benchmark': 'tiny', 'kept': earlier and earlier['mine'], 'mine': 0})"
    )
    done = run_three_times(tmp_path, main)
    assert done.returncode == 0, done.stderr
    kept = result_files.read_series(results / "tiny.json")["runs"]
    assert [r["kept"] for r in kept] == [1, 2, None]


def test_a_case_kept_from_an_earlier_command_names_that_command(tmp_path):
    case = Target("bench", "a case's figure", "cases.slow.value", "<= 5")
    measured = {"value": 1.0, "run": {"command": "python benchmarks/bench.py --cases slow"}}
    write_series(tmp_path, "bench", [{"cases": {"slow": measured}}, {"cases": {}}])
    found = cells(table.targets_table(tmp_path, (case,)), "a case's figure")
    assert found["by"] == "`python benchmarks/bench.py --cases slow`"
    assert found["runs"] == "1"
