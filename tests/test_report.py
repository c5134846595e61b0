"""The HTML report of a run: every section with its plot, and it renders in a real browser."""

import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from rayrollout.cli.commands import app
from rayrollout.cli.report import SECTIONS
from rayrollout.data.schema import EpisodeMetrics, Trajectory
from rayrollout.data.writer import PartWriter, make_sink


@pytest.fixture
def run_dir(tmp_path):
    rows = []
    for i in range(60):
        env = ("math", "weather", "code")[i % 3]
        failed = i % 10 == 0
        rows.append(
            Trajectory(
                task_id=f"{env}-{i}",
                sample_index=0,
                group_id=f"{env}-{i}",
                environment=env,
                reward=0.0 if failed else (i % 4) / 3,
                status="error" if failed else "ok",
                error="tool 'calculator' failed: ZeroDivisionError" if failed else None,
                metrics=EpisodeMetrics(
                    turns=2,
                    tool_calls=1,
                    seconds_model=0.2,
                    seconds_tools=0.1,
                    seconds_verify=0.05,
                    seconds_total=0.4 + i / 100,
                ),
            ).to_row()
        )
    sink = make_sink(tmp_path / "run", "parquet", "r")
    sink.start()
    writer = PartWriter(sink, 25, 60)
    for table in writer.add(rows) + writer.drain():
        writer.write(table)
    return tmp_path / "run"


def test_report_holds_every_section_with_its_plot(run_dir, tmp_path):
    page_path = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(run_dir), "--html", str(page_path)])
    assert result.exit_code == 0, result.output
    page = page_path.read_text()
    for anchor, heading in SECTIONS:
        section = re.search(f'<section id="{anchor}">(.*?)</section>', page, re.S)
        assert section, anchor
        assert heading in section.group(1)
        assert '<img alt="' in section.group(1) and "data:image/png;base64," in section.group(1)
    assert "60 episodes" in page
    assert "ZeroDivisionError" in page  # example error of the failed episodes


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium is not installed")
def test_report_renders_in_headless_chromium_without_console_errors(run_dir, tmp_path):
    from rayrollout.cli.report import render_report

    page_path = tmp_path / "report.html"
    page_path.write_text(render_report(run_dir))
    shot = tmp_path / "shot.png"
    result = subprocess.run(
        [
            "chromium",
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
            "--window-size=1000,3000",
            f"--screenshot={shot}",
            page_path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists() and shot.stat().st_size > 50_000, result.stderr[-2000:]
    console_lines = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    assert console_lines == []
