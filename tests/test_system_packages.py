"""A machine with pip alone: what needs a system package says which, and nothing fails for it.

Played by hiding a program from a child process's ``PATH`` (``hidden_programs``), so each
test runs the same way on a machine that has the package (CI) and on one that has not:

* a test marked ``system_package`` skips naming the package and its install command, and
  fails instead where ``RAYROLLOUT_REQUIRE_SYSTEM_PACKAGES`` names it (CI's setting);
* ``rayrollout demo`` without bubblewrap leaves the code environment out in one line naming
  the fix, and every episode it plays is ``ok``;
* ``rayrollout env test`` without pytest says in one line what to install.

A ``collect`` of code tasks without bubblewrap is ``tests/test_preflight.py``'s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
from cli_run import run_demo
from hidden_programs import path_without

from rayrollout.cli.console_log import LOG_FILE

ROOT = Path(__file__).resolve().parents[1]
GATED_TESTS = """\
import pytest


@pytest.mark.system_package("bubblewrap")
def test_in_the_sandbox():
    pass


def test_anywhere():
    pass
"""


def run_gated_tests(folder: Path, require: str | None) -> subprocess.CompletedProcess[str]:
    """pytest, with the repository's conftest.py, over one test that needs bubblewrap and one
    that does not, on a ``PATH`` without ``bwrap``; ``require``: CI's variable, if set."""
    shutil.copy(ROOT / "conftest.py", folder / "conftest.py")
    (folder / "test_gated.py").write_text(GATED_TESTS)
    env = {**os.environ, "PATH": path_without("bwrap", folder / "bin")}
    env.pop("RAYROLLOUT_REQUIRE_SYSTEM_PACKAGES", None)
    if require is not None:
        env["RAYROLLOUT_REQUIRE_SYSTEM_PACKAGES"] = require
    command = [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, "--rootdir", str(folder), str(folder / "test_gated.py")],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_test_needing_a_missing_package_skips_naming_the_package_and_its_install(tmp_path):
    done = run_gated_tests(tmp_path, None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 skipped" in done.stdout
    assert "bubblewrap is not installed (no bwrap): apt-get install bubblewrap" in done.stdout


def test_where_ci_requires_the_package_that_skip_fails_the_run(tmp_path):
    done = run_gated_tests(tmp_path, "bubblewrap,chromium")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "skipped" not in done.stdout
    assert (
        "bubblewrap is not installed (no bwrap): apt-get install bubblewrap; "
        "RAYROLLOUT_REQUIRE_SYSTEM_PACKAGES says it must be here"
    ) in done.stdout


def test_an_unknown_package_in_the_requirement_stops_pytest_naming_the_known_ones(tmp_path):
    done = run_gated_tests(tmp_path, "bubblewrap,chromum")
    assert done.returncode == 4, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "unknown system package(s) chromum: known ones are bubblewrap, chromium, slurm" in said


def test_the_demo_without_bubblewrap_leaves_code_out_in_one_line_and_plays_only_ok(tmp_path):
    """The README's demo on a machine without bubblewrap, as a user runs it: its own process,
    its own Ray (a Serve port of its own)."""
    path = path_without("bwrap", tmp_path / "bin")
    out, console = run_demo(tmp_path, "demo-no-bwrap", 1, PATH=path)
    left_out = [line for line in console.splitlines() if "left out" in line]
    assert len(left_out) == 2, console  # code, and shapes (it needs a model that sees)
    assert left_out[0].startswith("left out environment 'code': ")
    assert "`apt-get install bubblewrap`" in left_out[0]
    assert left_out[1].startswith("left out environment 'shapes': its tasks need a model")
    frame = pd.read_parquet(out)
    assert set(frame["environment"]) == {"weather", "math"}
    assert set(frame["status"]) == {"ok"}, frame["error"].dropna().unique()[:3]
    assert "demo done" in console
    # Nothing left to host on Serve: the scripted policy is the demo's own actor.
    log = out / LOG_FILE  # made at the first line Ray, Serve or an actor logs
    assert not log.exists() or "Started Serve" not in log.read_text()


def test_env_test_without_pytest_names_the_install_in_one_line(tmp_path):
    """After ``pip install -e .`` alone: pytest and its plugins cannot be imported, here or
    in any child (a ``sitecustomize`` on ``PYTHONPATH`` marks them absent)."""
    shim = tmp_path / "no-pytest"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import sys\n"
        "for name in ('pytest', '_pytest', 'pytest_asyncio', 'pytest_timeout'):\n"
        "    sys.modules[name] = None\n"
    )
    env = {**os.environ, "PYTHONPATH": str(shim), "COLUMNS": "200"}
    command = [sys.executable, "-m", "rayrollout.cli", "env", "test", "weather"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "verifier case(s) passed" in said
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: the tool tests of 'weather' did not run: they need pytest, pytest-asyncio, "
        "pytest-timeout, not installed here: pip install 'rayrollout[dev]' (or pass "
        "--cases-only to run only the verifier cases)"
    ], said
    assert "FAILED" not in said and "No module named" not in said
