"""The docs and the code's comments say what is true now, not how it came to be.

README.md, the docs site (docs/**), and the comments and docstrings of every part of the
package (rayrollout/, environments/, agents/, deployments/, benchmarks/) must carry no dated
run narrative (dates, UTC times), no commit hashes, no "this round" / "until now", no
history ("used to", "until this", "before this"), no machine-load figures and no issue
references: a reader cannot see the runs, commits or issues they point at, and they go
stale the day they are written. Measurements live in the benchmarks' JSON
(benchmarks/results/), history in CHANGELOG.md. Every relative link in README.md and the
docs points at a file that exists (mkdocs build --strict checks the docs' links and anchors
too; README.md is not part of the site), and module docstrings are short at the median.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("rayrollout", "environments", "agents", "deployments", "benchmarks")

FORBIDDEN: dict[str, re.Pattern[str]] = {
    "a date": re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b"),
    "a UTC time": re.compile(r"\b\d{1,2}:\d\d(?::\d\d)?(?:-\d{1,2}:\d\d)? ?UTC\b"),
    "a commit hash": re.compile(r"(?<![\w#/.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "run narrative": re.compile(r"\b(?:this round|until now)\b", re.IGNORECASE),
    # What the code was like before: a reader needs what it does and why, not its past
    # ("is used to" is the present tense, and stays).
    "history": re.compile(
        r"(?<!\bis )(?<!\bare )(?<!\bbe )\bused to\b|\buntil this\b|\bbefore this\b"
        r"|\bcommit [0-9a-f]{7,}\b",
        re.IGNORECASE,
    ),
    "a machine-load figure": re.compile(
        r"\bload average\b|\bload avg\b|\bload (?:at|of) \d|\bat load \d|\bload \d+(?:[.,-]\d+)*\b",
        re.IGNORECASE,
    ),
    "an issue reference": re.compile(
        r"\bissues? \d+\b|\bthe issue's\b|(?<![\w&#])#\d{1,5}\b(?![0-9a-fA-F])", re.IGNORECASE
    ),
}


def forbidden_in(text: str) -> list[str]:
    """What ``text`` says that it must not: one ``'<kind>: <the words>'`` per hit."""
    return [
        f"{kind}: {match.group(0)!r}"
        for kind, pattern in FORBIDDEN.items()
        for match in pattern.finditer(text)
    ]


def prose_files() -> list[Path]:
    """README.md and every Markdown page of the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def code_files() -> list[Path]:
    """Every Python and YAML file of the package's parts."""
    found: list[Path] = []
    for folder in CODE_FOLDERS:
        for pattern in ("*.py", "*.yaml"):
            found += [p for p in (ROOT / folder).rglob(pattern) if "__pycache__" not in p.parts]
    return sorted(found)


def comments_and_docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file; of every comment of a
    YAML file."""
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        for number, line in enumerate(source.splitlines(), start=1):
            if "#" in line:
                yield number, line.split("#", 1)[1]
        return
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    yield body[0].lineno, body[0].value.value


def test_the_patterns_catch_what_they_are_for():
    said = (
        "Measured 2026-11-24 at 20:23 UTC, load 25-30 (load average 3), after a1b2c3d "
        "(issue 19); this round, as in #12 and issue 4, until now. It used to fail before "
        "this module (commit 9346214)."
    )
    kinds = {hit.split(":")[0] for hit in forbidden_in(said)}
    assert kinds == set(FORBIDDEN)
    plain = (
        "Retries with backoff on 429; a colour #757575; sha256 of the token; 0.45 ms; "
        "the row's load_average_1m; `deadbeef` is a word; seed 1234567; the key is used to "
        "sign, as refused tools are."
    )
    assert forbidden_in(plain) == []


TEST_COUNT = re.compile(r"\b\d[\d,]* (?:tests|test cases)\b")
"""A hand-written count of tests: stale with the next test added (pytest says how many)."""


@pytest.mark.parametrize("path", prose_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_carry_no_run_narrative(path):
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {hit}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        for hit in forbidden_in(line)
        + [f"a test count: {m.group(0)!r}" for m in TEST_COUNT.finditer(line)]
    ]
    assert not hits, "\n".join(hits)


def test_code_comments_and_docstrings_carry_no_run_narrative():
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {hit}"
        for path in code_files()
        for number, text in comments_and_docstrings(path)
        for hit in forbidden_in(text)
    ]
    assert not hits, "\n".join(hits)


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", prose_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(path):
    missing = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of this page (mkdocs checks anchors)
        if not (path.parent / target.split("#", 1)[0]).exists():
            missing.append(target)
    assert not missing, f"{path.relative_to(ROOT)} links to missing files: {missing}"


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    # .ci/run installs and tests exactly as these say.
    assert (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && rayrollout demo"
        in readme
    )
    tests = "pytest -n 2 --dist loadfile"
    assert (
        f'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && {tests}\n'
        in readme
    )
    assert f"\n{tests} " in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_module_docstrings_are_six_lines_at_the_median():
    """A module's docstring says what it does and why in a few lines; the detail lives on
    the functions and classes it is about, next to their code."""
    import statistics

    lengths = {
        str(path.relative_to(ROOT)): len(
            (ast.get_docstring(ast.parse(path.read_text())) or "").splitlines()
        )
        for path in sorted((ROOT / "rayrollout").rglob("*.py"))
        if "__pycache__" not in path.parts
    }
    empty = [path for path, n in lengths.items() if not n]
    assert not empty, f"modules without a docstring: {empty}"
    longest = sorted(lengths.items(), key=lambda item: -item[1])[:5]
    assert statistics.median(lengths.values()) <= 6, f"the longest: {longest}"
