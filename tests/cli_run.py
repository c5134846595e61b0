"""``rayrollout collect`` run the way a user runs it, for test modules (a plain module, not a
conftest: its names import the same whichever conftest pytest loaded last)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from netutil import free_port
from typer.testing import CliRunner

from rayrollout.cli.commands import app


def collect_rows(
    base: Path, rows: list[dict[str, Any]], config: dict[str, Any], *args: str
) -> Path:
    """``rayrollout collect`` of ``rows`` (written to ``base/tasks.jsonl``) with ``config``
    and the flags ``args``: ``collect_tasks`` of that file."""
    tasks = base / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return collect_tasks(base, tasks, config, *args)


def collect_tasks(
    base: Path, tasks: Path, config: dict[str, Any], *args: str, exit_code: int = 0
) -> Path:
    """``rayrollout collect`` of the tasks file ``tasks`` with ``config`` (written to
    ``base/run.yaml``) and the flags ``args``; the output folder, ``base/out``. An exit code
    other than ``exit_code`` fails the test with the command's output."""
    config_path = base / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    out = base / "out"
    command = ["collect", str(tasks), *args, "--out", str(out), "--config", str(config_path)]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == exit_code, f"{result.output}\n{result.exception!r}"
    return out


def run_demo(
    base: Path,
    namespace: str,
    episodes: int,
    serve_port: int | None = None,
    exit_code: int = 0,
    settings: dict[str, Any] | None = None,
    **env: str,
) -> tuple[Path, str]:
    """``rayrollout demo`` as a user runs it: its own process and its own Ray (namespace
    ``namespace``, Serve on ``serve_port`` or a free port, more config from ``settings``),
    80 columns, ``env`` added to the environment. Returns the output folder, ``base/demo``,
    and the console; an exit other than ``exit_code`` fails the test."""
    config = base / "demo.yaml"
    port = serve_port if serve_port is not None else free_port()
    given = {"ray": {"serve_port": port}, "namespace": namespace, **(settings or {})}
    config.write_text(yaml.safe_dump(given))
    out = base / "demo"
    environ = {**os.environ, "COLUMNS": "80", **env}
    environ.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "rayrollout.cli", "demo", "--out", str(out)]
    done = subprocess.run(
        [*command, "-n", str(episodes), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=540,
        env=environ,
    )
    console = done.stdout + done.stderr
    assert done.returncode == exit_code, console[-3000:]
    return out, console
