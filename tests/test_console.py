"""A quiet, honest console: rayrollout's own progress and summary only, within 80 columns;
Ray's, Serve's and the workers' lines in the run's log file; failed episodes explained, and
a run in which every episode failed ending with exit code 3."""

import logging
import re
import socket
import sys
from pathlib import Path

import pytest
import typer
import yaml
from cli_run import run_demo
from rich.console import Console
from trajectories import write_through
from typer.testing import CliRunner

from rayrollout.cli.commands import app
from rayrollout.cli.console_log import LOG_FILE, routed_logs
from rayrollout.cli.failures import ALL_FAILED_EXIT, reason_key, reason_of, report_failures
from rayrollout.cli.progress import RunProgress, summary_table
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import EpisodeMetrics, Trajectory
from rayrollout.data.writer import make_sink
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import EnvStats, RunStats

# What Ray, Serve, gRPC and math-verify print; none of it may reach the console.
NOISE = ("fork_posix", "Timeout is disabled", "INFO", "WARNING", "(raylet)", "pid=")
RAY_MODULE = re.compile(r"\bray\.(?!data\.read_parquet)")  # the hint names ray.data itself


def lines_of(console: Console) -> list[str]:
    return console.export_text().splitlines()


def test_errors_differing_only_in_their_values_share_a_reason_that_keeps_the_cause():
    first = reason_of("tool 'explode' failed: RuntimeError: boom on 'a'")
    assert first == "tool 'explode' failed: RuntimeError: boom on 'a'"  # the cause, not the type
    second = reason_of("tool 'explode' failed: RuntimeError: boom on 'b'\nTraceback")
    assert reason_key(first) == reason_key(second)
    assert reason_key(first) != reason_key(reason_of("tool 'other' failed: RuntimeError: x"))
    step = "tally environment 'tally' failed in step {}: ValueError: the tally broke"
    assert reason_key(step.format(1)) == reason_key(step.format(2))  # one failure, any step
    gem = "setting up the environment failed: ResetStepError: GEM id 'x' is not registered"
    assert reason_of(gem) == gem
    assert reason_key(gem) != reason_key(reason_of("verifier failed: ValueError: no gold"))
    assert reason_of(None) == reason_of("  ") == "(no error message)"


def test_summary_table_fits_80_columns_and_cuts_no_figure():
    def stats(episodes, statuses, close_errors=0):
        return EnvStats(
            episodes=episodes,
            reward_sum=episodes * 0.25,
            statuses=statuses,
            close_errors=close_errors,
            turns=3 * episodes,
            tool_calls=2 * episodes,
            seconds_model=episodes,
            seconds_total=2.0 * episodes,
            seconds_sample=[0.5, 123.4],
        )

    failing = {"ok": 9000, "error": 600, "timeout": 400}
    snapshot = RunSnapshot(
        elapsed_s=1234.5,
        in_flight=0,
        episodes_per_s=8.1,
        total=stats(20000, {"ok": 19000, "error": 600, "timeout": 400}, close_errors=3),
        by_env={
            "math_with_judge_long": stats(10000, failing, close_errors=3),
            "weather": stats(10000, {"ok": 10000}),
        },
    )
    console = Console(width=80, record=True)
    console.print(summary_table(snapshot))
    lines = lines_of(console)
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "…" not in text
    for figure in ("20000", "10000", "0.250", "3.00", "2.00", "123/123", "50/0/0/50"):
        assert figure in text, figure
    for status in ("error=600", "timeout=400", "close", "failed=3"):
        assert status in text, status
    assert "math_with_judge" in text and "weather" in text


def test_progress_line_fits_80_columns_with_large_figures():
    console = Console(width=80, record=True)
    with RunProgress(console, redirect=False) as progress:
        progress.begin(10000)
        progress.progress.update(
            progress.task_id, completed=9999, rate=123.4, reward=0.5, failed=1234, in_flight=256
        )
    (line,) = [line for line in lines_of(console) if line.strip()]
    assert len(line) <= 80 and "…" not in line
    assert "9999/10000" in line and "123.4/s" in line and "failed 1234" in line


def test_routed_logs_keep_the_console_and_send_the_rest_to_the_file(tmp_path, capsys):
    noisy = logging.getLogger("rayrollout-test-noise")
    noisy.propagate = False
    handler = logging.StreamHandler(sys.stderr)  # like Ray's and Serve's handlers
    noisy.addHandler(handler)
    console = Console(stderr=True, width=80)
    try:
        with routed_logs(console, tmp_path / "out"):
            console.print("rayrollout's own line")
            print("a worker's stderr line", file=sys.stderr)
            print("a worker's stdout line")
            noisy.warning("a driver-side Ray warning")
        after = handler.stream
    finally:
        noisy.removeHandler(handler)
    err = capsys.readouterr().err
    assert "rayrollout's own line" in err
    assert "worker's" not in err and "Ray warning" not in err
    assert f"{tmp_path / 'out' / LOG_FILE}\n" in err  # the console says where they went
    log = (tmp_path / "out" / LOG_FILE).read_text()
    for line in ("a worker's stderr line", "a worker's stdout line", "a driver-side Ray warning"):
        assert line in log
    assert after is sys.stderr  # the handler writes where it did before


def test_routed_logs_release_the_lines_ray_holds_back_as_repeats_into_the_file(tmp_path, capsys):
    """Ray's driver holds a line that a second worker repeats, to count it, and prints what
    it holds at ``ray.shutdown``: for the CLI, the process's exit, on the console after the
    summary (the demo's two workers both logged Serve's router start-up). Fed through Ray's
    own printing path, as its log thread feeds it, the held copy must reach the file."""
    from ray._private.worker import print_to_stdstream

    line = "serve -- ConsistentHashRouter initialized for Deployment(held-back-test)"
    console = Console(stderr=True, width=80)
    with routed_logs(console, tmp_path / "out"):
        for pid in ("4786", "4787"):  # the same line from two workers, as the demo's did
            batch = {"ip": "127.0.0.1", "localhost": "127.0.0.1", "pid": pid}
            print_to_stdstream(
                {**batch, "is_err": True, "actor_name": "WorkerActor", "lines": [line]},
                ignore_prefix=False,
            )
    err = capsys.readouterr().err
    assert "ConsistentHashRouter" not in err
    log = (tmp_path / "out" / LOG_FILE).read_text()
    assert "WorkerActor pid=4786" in log and "WorkerActor pid=4787" in log


def test_routed_logs_make_no_file_for_a_silent_run_and_verbose_routes_nothing(tmp_path, capsys):
    console = Console(stderr=True)
    with routed_logs(console, tmp_path / "quiet"):
        console.print("summary")
    assert not (tmp_path / "quiet").exists()  # a run refused early leaves no folder
    with routed_logs(console, tmp_path / "loud", verbose=True):
        print("a worker's line", file=sys.stderr)
    assert "a worker's line" in capsys.readouterr().err
    assert not (tmp_path / "loud").exists()


def written_run(folder: Path, outcomes: list[tuple[str, str | None]]) -> RunSnapshot:
    """Rows with these (status, error) outcomes written as parts of ``folder``; the run's
    snapshot as the engine would report it."""
    rows = [
        Trajectory(
            task_id=f"t{i}",
            sample_index=i % 2,
            group_id=f"t{i}",
            environment="faulty",
            status=status,
            error=error,
            metrics=EpisodeMetrics(seconds_total=1.0),
        ).to_row()
        for i, (status, error) in enumerate(outcomes)
    ]
    write_through(make_sink(folder, "parquet", "r"), rows, 3)
    stats = RunStats()
    stats.add(rows)
    parts = [str(p) for p in RunFolder(folder).parts()]
    return RunSnapshot(**stats.snapshot(), parts=parts)


def test_failed_episodes_are_explained_with_a_command_to_show_one(tmp_path):
    boom = "tool 'explode' failed: RuntimeError: boom on '{}'"
    outcomes = [("error", boom.format(i)) for i in range(4)]
    outcomes += [("timeout", "policy call to http://x/v1 timed out after 1.0s (0 retries)")]
    outcomes += [("ok", None), ("max_turns", None)]
    console = Console(width=80, record=True)
    report_failures(console, written_run(tmp_path / "out", outcomes))  # not all failed: no exit
    text = console.export_text()
    assert "failed: 5 of 7 episodes (error 4, timeout 1)" in text
    assert "     4  tool 'explode' failed: RuntimeError: boom on '0'\n" in text
    assert "     1  policy call to http://x/v1 timed out" in text
    assert f"e.g. rayrollout show {tmp_path / 'out'} --task-id t0 --sample 0" in text
    assert "every episode failed" not in text


def test_a_run_where_every_episode_failed_ends_with_exit_code_3(tmp_path):
    missing = ["db", "table", "user", "disk", "key"]
    outcomes = [("error", f"setting up the environment failed: no {what}") for what in missing]
    outcomes += [("error", "verifier failed: KeyError: 'gold'")]
    console = Console(width=80, record=True)
    with pytest.raises(typer.Exit) as ended:
        report_failures(console, written_run(tmp_path / "out", outcomes), top=2)
    assert ended.value.exit_code == ALL_FAILED_EXIT == 3
    text = console.export_text()
    assert "failed: 6 of 6 episodes (error 6)" in text
    assert "     4  for other reasons" in text  # 6 distinct reasons, 2 shown
    assert "every episode failed: exit code 3" in text


def test_collect_help_documents_verbose_and_the_exit_codes():
    result = CliRunner().invoke(app, ["collect", "--help"], env={"COLUMNS": "200"})
    said = " ".join(result.output.split())
    assert "--verbose" in said and "-v" in said and "_logs/collect.log" in said
    assert "3 every episode failed" in said


def test_a_real_run_whose_every_episode_fails_explains_why_and_exits_3(tmp_path, serve_session):
    config = tmp_path / "run.yaml"
    environments = {"faulty": {"path": "fixture_envs:FaultyEnv", "hosting": "inline"}}
    config.write_text(
        yaml.safe_dump(
            {
                "namespace": f"console-{tmp_path.name}",
                "ray": {"serve_port": serve_session},
                "environments": environments,
            }
        )
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            f'{{"task_id": "crash-{i}", "prompt": "break {i}", "environment": "faulty"}}\n'
            for i in range(3)
        )
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        ["collect", str(tasks), "--out", str(out), "-n", "2", "--config", str(config)],
        env={"COLUMNS": "80"},
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 3, result.output
    assert "failed: 6 of 6 episodes (error 6)" in said
    assert "6 tool 'explode' failed: RuntimeError" in said
    assert re.search(rf"e\.g\. rayrollout show {re.escape(str(out))} --task-id crash-\d", said)
    assert "every episode failed: exit code 3" in said
    assert len(list(out.glob("part-*.parquet"))) >= 1  # the failed rows are written still


def test_the_demo_console_is_quiet_and_fits_80_columns(tmp_path):
    """The real CLI in its own process and its own Ray, as a user runs it."""
    out, console = run_demo(tmp_path, "console-demo", 2)
    lines = console.splitlines()
    assert len(lines) < 40, console
    for noise in NOISE:
        assert noise not in console, noise
    assert not RAY_MODULE.search(console), console
    assert "…" not in console
    # Every line fits, but those left unwrapped on purpose: paths, calls and fixes to copy.
    unwrapped = ("wrote ", "logs of Ray", "left out environment", "policy: ", "demo done")
    assert [line for line in lines if len(line) > 80 and not line.startswith(unwrapped)] == []
    assert "rollout summary" in console and "demo done" in console
    # The noise went to the log file, and the code sandbox made none (it forked before).
    # Without bubblewrap the demo leaves the code sandbox out, Serve never starts and nothing
    # is logged: the file is made at its first line, so then there is none.
    log_file = out / LOG_FILE
    log = log_file.read_text() if log_file.exists() else ""
    from rayrollout.environments.code.env import CodeEnv

    # Serve starts for the code sandbox's environment only (the demo's policy is an actor).
    assert ("Started Serve" in log) is (CodeEnv.unavailable_reason() is None)
    assert "fork_posix" not in log and "Timeout is disabled" not in log


def test_a_serve_port_another_program_holds_ends_the_run_in_one_line_naming_it(tmp_path):
    """Serve's proxy cannot bind a port another program holds; the run stops on one line
    naming the port and the setting that moves it, not on Serve's traceback.

    The policy is put on Serve: the demo's own choices (its policy in a plain actor, the code
    environment only where bubblewrap is installed) may start no Serve at all."""
    on_serve = {"policy": {"scripted": {"hosting": "serve"}}}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        _, console = run_demo(
            tmp_path, "port-taken", 8, serve_port=port, exit_code=1, settings=on_serve
        )
    errors = [line for line in console.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, console[-3000:]
    assert f"Serve's HTTP port {port} on 127.0.0.1 is taken by another program" in errors[0]
    assert "ray.serve_port" in errors[0]
    assert "Traceback" not in console and "RayTaskError" not in console
