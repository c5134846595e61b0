"""The trainers page's SkyRL block runs as written, in SkyRL's venv, against this tier's
engine: only the service's URL and token file are swapped for the ones the tier started."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from checks import ROOT, trainer_env, trainer_python

sys.path.insert(0, str(ROOT / "tests"))
from docs_blocks import blocks  # noqa: E402

from rayrollout.engine.secret_env import route_token_path  # noqa: E402

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(600)]

PAGE = ROOT / "docs" / "how-to" / "trainers.md"
PAGE_URL = '"http://127.0.0.1:8321"'
PAGE_TOKEN_FILE = '"~/.rayrollout/route-tokens/rayrollout"'


def section_block(section: str, language: str) -> str:
    """The one ``language`` block under the page's ``## section`` heading."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    first = text[:start].count("\n") + 1
    last = text[: end if end != -1 else len(text)].count("\n") + 1
    found = [b.code for b in blocks(PAGE) if b.language == language and first <= b.line <= last]
    assert len(found) == 1, f"{PAGE.name} ## {section}: {len(found)} {language} blocks"
    return found[0]


def test_the_skyrl_section_plays_a_batch_as_the_page_shows(service, tmp_path):
    from conftest import NAMESPACE

    python = trainer_python("skyrl")
    code = section_block("SkyRL", "python")
    assert PAGE_URL in code and PAGE_TOKEN_FILE in code, "the block's URL or token file moved"
    code = code.replace(PAGE_URL, repr(service["url"])).replace(
        PAGE_TOKEN_FILE, repr(str(route_token_path(NAMESPACE)))
    )
    script = tmp_path / "skyrl_page.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run(
        [str(python), str(script)],
        capture_output=True,
        env=trainer_env(),
        cwd=tmp_path,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rewards_text, failed = done.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    rewards = ast.literal_eval(rewards_text)
    # One task, 4 samples (a GRPO group), each scored by the weather environment.
    assert len(rewards) == 4 and all(isinstance(r, float) for r in rewards), rewards
    assert float(failed) == 0, done.stdout
