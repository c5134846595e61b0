"""The first-run and first-environment tutorials work as written.

Each tutorial's code blocks run in order in an empty folder, as a reader would type them: a
block with a title (```` ```json title="tasks.jsonl" ````) is a file the reader writes, a
``bash`` block runs in bash, a ``python`` block in this Python. A block may be left out only
by an HTML comment ``<!-- docs-test: skip (why) -->`` on the line before it (the install
step: this venv is the installed one). Every other block must be one of those three, so a
tutorial cannot grow a step this test does not take.

The tutorials use the scripted policy (no GPU, no key) and a few episodes; they start Ray
and Serve as the reader's commands do, so Serve's default port must be free.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from docs_blocks import blocks, reader_environment, run_block, save_block
from netutil import port_is_free

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"


def run_tutorial(path: Path, folder: Path) -> None:
    env = reader_environment()
    for block in blocks(path):
        where = f"{path.relative_to(ROOT)} line {block.line}"
        if block.skipped:
            continue
        if block.title is not None:
            save_block(block, folder)
            continue
        if not run_block(block, folder, env, where, timeout=600):
            raise AssertionError(
                f"{where}: a {block.language or 'plain'} block without a title is neither "
                "run nor written; give it a title, or a docs-test skip comment"
            )


def test_the_block_reader_sees_titles_skips_and_languages():
    found = blocks(TUTORIALS / "first-run.md")
    assert found[0].skipped and "pip install -e ." in found[0].code
    assert [b.title for b in found if b.title] == ["tasks.jsonl"]
    assert {b.language for b in found if not b.skipped and not b.title} == {"bash", "python"}


# The hang guard covers two blocks at their own 600 s limit, not the suite's 300 s default.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", ["first-run.md", "first-environment.md"])
def test_the_tutorial_runs_as_written(name, tmp_path):
    if not port_is_free(8000):
        pytest.skip("port 8000 is taken: the tutorials' commands use Serve's default port")
    run_tutorial(TUTORIALS / name, tmp_path)
    folders = sorted(p for p in (tmp_path / "rollouts").iterdir() if p.is_dir())
    assert folders, "the tutorial wrote no rollouts"
    for folder in folders:  # what the tutorials promise: every episode they play is ok
        frame = pd.read_parquet(folder)
        assert len(frame) > 0 and set(frame["status"]) == {"ok"}, (folder.name, frame["error"])
    if name == "first-environment.md":
        assert (pd.read_parquet(tmp_path / "rollouts" / "capitals")["reward"] == 1.0).all()
