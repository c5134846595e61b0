"""The HTML report of a run: its figures are the engine's, it renders in a real browser, and
every failed episode on it opens with the command it gives.

Most runs here are written as parts by the real writer with timestamps chosen by the test
(``mixed_run``: two collect calls 95 s apart, Parquet then JSONL, every status), so the
expected duration and throughput are known exactly and no Ray is needed; one test collects
a real resumed run and compares the page with the engine's own summaries.
"""

import json
import re
import shlex
import shutil
import subprocess
from collections import Counter
from datetime import UTC, datetime
from html.parser import HTMLParser

import pytest
from exports import write_parts
from typer.testing import CliRunner

from rayrollout.cli.commands import app
from rayrollout.cli.report import SECTIONS, render_report
from rayrollout.cli.report_figures import STATUS_COLOURS
from rayrollout.data.episode_table import EmptyRunError, load_episodes
from rayrollout.data.run_summary import segment_labels, summarize
from rayrollout.data.schema import EpisodeMetrics, Trajectory
from rayrollout.engine.stats import RunStats

T0 = 1_700_000_000.0
GAP = 95.0
MODEL = "Qwen/Qwen3-0.6B"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
needs_chromium = pytest.mark.system_package("chromium")


def episode(task_id, sample, env, queued, wait, seconds, status="ok", reward=1.0, version=0):
    """A finished episode queued at ``queued``, started ``wait`` s later, ``seconds`` long."""
    started = queued + wait
    failed = status != "ok"
    return Trajectory(
        task_id=task_id,
        sample_index=sample,
        group_id=task_id,
        environment=env,
        model=MODEL,
        policy_version=version,
        reward=0.0 if failed else reward,
        status=status,
        error=f"{status}: tool 'calculator' failed: ZeroDivisionError" if failed else None,
        metrics=EpisodeMetrics(
            started_at=started,
            seconds_queued=wait,
            seconds_total=seconds,
            turns=1 + sample,
            tool_calls=sample,
            tokens_in=300 * (1 + sample),
            tokens_out=40 + 7 * sample,
            seconds_model=0.6 * seconds,
            seconds_tools=0.2 * seconds,
            seconds_verify=0.05 * seconds,
        ),
        created_at=datetime.fromtimestamp(started - 0.001, UTC),  # built as it begins
    )


def first_call():
    """24 episodes (8 tasks x 3 samples), queued every 0.25 s; even tasks score alike."""
    out = []
    for i in range(24):
        task, sample = i // 3, i % 3
        env = ("math", "weather")[task % 2]
        status = "error" if i % 9 == 4 else "timeout" if i % 11 == 7 else "ok"
        reward = 1.0 if task % 2 == 0 else (1.0, 0.0, 0.5)[sample]
        wait, seconds = 0.1 * (i % 4), 0.8 + 0.35 * (i % 7)
        out.append(episode(f"t{task}", sample, env, T0 + 0.25 * i, wait, seconds, status, reward))
    return out


def second_call(after):
    """12 episodes (4 new tasks x 3 samples) on policy version 1, ``GAP`` s after ``after``."""
    statuses = {2: "max_turns", 5: "truncated", 9: "error"}
    out = []
    for i in range(12):
        task, sample = 8 + i // 3, i % 3
        env = ("math", "weather")[task % 2]
        queued = after + GAP + 0.4 * i
        out.append(
            episode(
                f"t{task}",
                sample,
                env,
                queued,
                0.05,
                1.5 + 0.2 * i,
                statuses.get(i, "ok"),
                (0.0, 1.0, 1.0)[sample],
                version=1,
            )
        )
    return out


def write(directory, fmt, run_id, trajectories, rows_per_part=10):
    """The trajectories as parts of run ``run_id`` (``exports.write_parts``)."""
    return write_parts(directory, trajectories, fmt, rows_per_part, run_id)


def end_of(trajectories):
    return max(t.metrics.started_at + t.metrics.seconds_total for t in trajectories)


def start_of(trajectories):
    return min(t.metrics.started_at - t.metrics.seconds_queued for t in trajectories)


@pytest.fixture
def mixed_run(tmp_path):
    """A resumed run: a Parquet collect call, then a JSONL one ``GAP`` s later."""
    first = first_call()
    second = second_call(end_of(first))
    run = tmp_path / "run"
    write(run, "parquet", "20240101-a", first)
    write(run, "jsonl", "20240101-b", second)
    return run, first, second


def expected_figures(*calls):
    """What the engine's ``stats()`` says of these episodes, summed over the collect calls,
    and the duration and throughput the test knows from the timestamps it chose."""
    stats = RunStats()
    for call in calls:
        stats.add([t.to_row() for t in call])
    active = sum(end_of(call) - start_of(call) for call in calls)
    episodes = stats.total.episodes
    figures = {
        "episodes": episodes,
        "mean_reward": stats.total.mean_reward,
        "errors": stats.total.errors,
        "active_s": active,
        "episodes_per_s": episodes / active,
        "wall_s": end_of(calls[-1]) - start_of(calls[0]),
        "segments": len(calls),
        "mean_queued_s": stats.total.mean_queued_s,
    }
    figures.update({f"status:{s}": n for s, n in stats.total.statuses.items()})
    return figures


def test_summary_of_a_resumed_run_matches_the_engines_figures_and_its_clock(mixed_run):
    run, first, second = mixed_run
    summary = summarize(load_episodes(run))
    expected = expected_figures(first, second)
    assert summary.episodes == expected["episodes"] == 36
    assert summary.statuses == {k[7:]: v for k, v in expected.items() if k.startswith("status:")}
    assert set(summary.statuses) == {"ok", "error", "timeout", "max_turns", "truncated"}
    assert summary.mean_reward == pytest.approx(expected["mean_reward"])
    assert summary.active_s == pytest.approx(expected["active_s"])
    assert summary.episodes_per_s == pytest.approx(expected["episodes_per_s"])
    assert summary.wall_s == pytest.approx(expected["wall_s"])
    assert [s.episodes for s in summary.segments] == [24, 12]
    assert [s.runs for s in summary.segments] == [["20240101-a"], ["20240101-b"]]
    assert summary.segments[1].gap_before_s == pytest.approx(GAP)
    assert summary.models == [MODEL] and summary.policy_versions == {0: 24, 1: 12}


def test_duration_runs_from_the_first_episode_queued_to_the_last_one_ended(tmp_path):
    # The old report's bug: rows are made as episodes begin, and it divided by the spread of
    # their creation times. Ten episodes starting within 0.27 s of a 14.6 s run read as
    # 0.3 s at 37 episodes/s.
    rows = [episode(f"q{i}", 0, "math", T0, 0.03 * i, 14.6 - 0.03 * i - 0.1 * i) for i in range(10)]
    summary = summarize(load_episodes(write(tmp_path / "run", "parquet", "r", rows)))
    assert summary.active_s == pytest.approx(14.6)
    assert summary.episodes_per_s == pytest.approx(10 / 14.6)
    assert len(summary.segments) == 1


def test_the_summary_counts_turns_a_weight_update_cut_and_reads_parts_without_them(tmp_path):
    from rayrollout.cli.report_page import run_table

    rows = [episode(f"u{i}", 0, "math", T0, 0.0, 1.0) for i in range(3)]
    rows[0].metrics.turns_across_updates, rows[2].metrics.turns_across_updates = 1, 2
    summary = summarize(load_episodes(write(tmp_path / "new", "parquet", "r", rows)))
    assert summary.turns_across_updates == 3
    assert '<th class="text">turns across a weight update</th><td class="text">3</td>' in (
        run_table(tmp_path / "new", summary, 0)
    )
    # Parts written before the metric existed: 0, not an error.
    old = tmp_path / "old" / "part-00000-r.jsonl"
    old.parent.mkdir()
    lines = []
    for row in rows:
        data = row.model_dump(mode="json")
        del data["metrics"]["turns_across_updates"]
        lines.append(json.dumps(data))
    old.write_text("\n".join(lines) + "\n")
    assert summarize(load_episodes(old.parent)).turns_across_updates == 0


def test_an_idle_stretch_inside_one_run_opens_a_new_segment(tmp_path):
    rows = [episode("a", 0, "math", T0, 0.0, 1.0), episode("b", 0, "math", T0 + 0.5, 0.0, 1.0)]
    rows += [episode("c", 0, "math", T0 + 1.5 + 5.0, 0.0, 2.0)]  # 5 s with nothing running
    frame = load_episodes(write(tmp_path / "run", "parquet", "r", rows))
    assert list(segment_labels(frame).sort_index()) == [0, 0, 1]
    summary = summarize(frame)
    assert summary.active_s == pytest.approx(1.5 + 2.0)
    assert summary.segments[1].gap_before_s == pytest.approx(5.0)


def test_group_spread_counts_groups_whose_samples_all_scored_alike(mixed_run):
    run, _, _ = mixed_run
    groups = summarize(load_episodes(run)).groups
    frame = load_episodes(run)
    by_task = frame.groupby("task_id")["reward"]
    zero = sum(1 for _, rewards in by_task if rewards.nunique() == 1)
    assert groups.groups == 12 and groups.samples_per_group == {3: 12}
    assert groups.zero_spread == zero and 0 < zero < 12
    assert groups.zero_spread_share == pytest.approx(zero / 12)


class _Figures(HTMLParser):
    """Every ``data-figure``/``data-value`` pair, badge colours, and the show commands."""

    def __init__(self):
        super().__init__()
        self.figures, self.badges, self.commands, self._code = {}, {}, [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-figure" in attrs:
            self.figures[attrs["data-figure"]] = attrs["data-value"]
        if attrs.get("class") == "badge":
            self._badge = attrs["style"]
        self._code = tag == "code"
        self._in_badge = attrs.get("class") == "badge"

    def handle_data(self, data):
        if getattr(self, "_in_badge", False):
            self.badges[data.split()[0]] = self._badge
            self._in_badge = False
        if self._code and data.startswith("rayrollout show ") and "--task-id" in data:
            self.commands.append(data)


def chromium(tmp_path, page, *flags):
    """Run headless Chromium on the page; returns (stdout, stderr)."""
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            *flags,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    return result.stdout, result.stderr


def rendered_figures(tmp_path, run):
    """The report rendered by Chromium, read back from its DOM."""
    page_path = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(run), "--html", str(page_path)])
    assert result.exit_code == 0, result.output
    dom, stderr = chromium(tmp_path, page_path, "--dump-dom")
    assert "</section>" in dom, stderr[-2000:]
    parsed = _Figures()
    parsed.feed(dom)
    return dom, parsed


@needs_chromium
def test_the_rendered_page_shows_the_engines_figures_of_a_resumed_run(mixed_run, tmp_path):
    run, first, second = mixed_run
    dom, parsed = rendered_figures(tmp_path, run)
    for name, value in expected_figures(first, second).items():
        assert name in parsed.figures, name
        assert float(parsed.figures[name]) == pytest.approx(value), name
    # The text people read says what the data attribute says.
    assert re.search(r'data-figure="episodes"[^>]*>.*?>36<', dom, re.S)
    # Status colours read right: ok green, error red, each status its own.
    assert parsed.badges["ok"] == f"background:{STATUS_COLOURS['ok']}" == "background:#2e7d32"
    assert parsed.badges["error"] == "background:#c62828"
    assert len({parsed.badges[s] for s in STATUS_COLOURS}) == len(STATUS_COLOURS)
    for anchor, heading in SECTIONS:
        section = re.search(f'<section id="{anchor}">(.*?)</section>', dom, re.S)
        assert section and heading in section.group(1).replace("&amp;", "&"), anchor
    for anchor in ("throughput", "rewards", "groups", "lengths", "time", "versions", "status"):
        section = re.search(f'<section id="{anchor}">(.*?)</section>', dom, re.S).group(1)
        assert 'src="data:image/png;base64,' in section, anchor
    assert MODEL in dom and "does not keep the run's config" in dom


@needs_chromium
def test_every_failed_episode_on_the_page_opens_with_its_command(mixed_run, tmp_path):
    run, first, second = mixed_run
    _, parsed = rendered_figures(tmp_path, run)
    failed = {(t.task_id, t.sample_index) for t in first + second if t.status != "ok"}
    listed = set()
    for command in parsed.commands:
        args = shlex.split(command)
        assert args[:2] == ["rayrollout", "show"]
        listed.add((args[args.index("--task-id") + 1], int(args[args.index("--sample") + 1])))
        result = CliRunner().invoke(app, args[1:])
        assert result.exit_code == 0, (command, result.output)
        assert args[args.index("--task-id") + 1] in result.output
    assert failed <= listed  # every failed one (fewer than the list's limit), and the slowest
    assert len(listed - failed) >= 1


@needs_chromium
def test_the_page_renders_full_width_without_console_errors(mixed_run, tmp_path):
    run, _, _ = mixed_run
    page_path = tmp_path / "report.html"
    page_path.write_text(render_report(run))
    shot = tmp_path / "shot.png"
    _, stderr = chromium(tmp_path, page_path, "--window-size=1400,2400", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 50_000, stderr[-2000:]
    assert [line for line in stderr.splitlines() if "CONSOLE" in line] == []
    page = page_path.read_text()
    assert "max-width: 960px" not in page and "img.plot { width: 100%" in page


def test_a_folder_without_parts_is_one_error_line(tmp_path):
    with pytest.raises(EmptyRunError, match="no part files"):
        load_episodes(tmp_path)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert result.output.startswith("error: no part files") and "no such folder" in result.output


def test_a_real_resumed_run_reads_as_the_engine_counted_it(tmp_path, serve_session):
    """Two real collect calls into one folder (the second resumes with more tasks): the
    report's figures are the sum of the engine's summaries, and each call's duration sits
    inside the engine's own clock for it, holding its longest episode."""
    from rayrollout import RolloutEngine, RunConfig

    def config(resume):
        return RunConfig.model_validate(
            {
                "namespace": "report-tests",
                "environments": {
                    "echo": {"path": "fixture_envs:EchoEnv", "hosting": "inline"},
                    "faulty": {"path": "fixture_envs:FaultyEnv", "hosting": "inline"},
                },
                "output": {"dir": str(tmp_path / "run")},
                "resume": resume,
                "ray": {"serve_port": serve_session},
                "concurrency": 8,
            }
        )

    tasks = [{"task_id": f"say-{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(4)]
    tasks.append({"task_id": "crash", "prompt": "break it", "environment": "faulty"})
    more = [{"task_id": f"more-{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(3)]
    summaries = []
    for resume, batch in ((False, tasks), (True, tasks + more)):
        with RolloutEngine(config(resume)) as engine:
            summaries.append(engine.collect(batch, num_repeats=2).summary)
    frame = load_episodes(tmp_path / "run")
    summary = summarize(frame)
    statuses = Counter()
    for s in summaries:
        statuses.update(s.total.statuses)
    assert summary.episodes == sum(s.total.episodes for s in summaries) == 16
    assert summary.statuses == dict(statuses) and statuses["error"] == 2
    reward = sum(s.total.reward_sum for s in summaries) / 16
    assert summary.mean_reward == pytest.approx(reward)
    assert len(summary.segments) == 2
    for segment, engine_summary in zip(summary.segments, summaries, strict=True):
        assert segment.episodes == engine_summary.total.episodes
        assert segment.seconds <= engine_summary.elapsed_s + 0.01  # clocks of two processes
        rows = frame[frame["run"].isin(segment.runs)]
        assert segment.seconds >= rows["m_seconds_total"].max()
    assert summary.active_s < summary.wall_s  # the gap between the calls is not counted
    page = render_report(tmp_path / "run")
    assert 'data-figure="episodes" data-value="16"' in page


def test_a_run_of_one_episode_that_never_started_still_renders(tmp_path):
    # A lost worker's row: no start time, no seconds; the page must not divide by zero.
    row = Trajectory(
        task_id="lost",
        sample_index=0,
        group_id="lost",
        environment="math",
        status="error",
        error="worker died",
        created_at=datetime.fromtimestamp(T0, UTC),
    )
    run = write(tmp_path / "run", "parquet", "r", [row])
    summary = summarize(load_episodes(run))
    assert (summary.episodes, summary.active_s, summary.episodes_per_s) == (1, 0.0, 0.0)
    assert summary.segments[0].start == pytest.approx(T0)
    page = render_report(run)
    assert "No task has two samples or more" in page and "worker died" in page
    assert 'data-figure="status:error" data-value="1"' in page
