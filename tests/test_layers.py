"""The house plan, checked: parts import only downwards, and the wheel installs one package.

Each subpackage of ``rayrollout`` is a part with a rank (its ``__init__`` docstring says what
it may import). A module may import its own part and parts of lower rank, never a higher
one; ``envkit`` and ``policy`` share a rank and do not import each other; the core
never names a plugin (``rayrollout.environments``, ``rayrollout.deployments``): it finds them
through the registry. Imports inside functions count too: a lazy import up a layer is still
a step back up.

One job per module, and a long module says which: a module of the package, a plugin
folder or ``benchmarks/`` over ``LONG_MODULE_LINES`` lines (as ``wc -l`` counts) names its
one job and why it is one in its docstring's first line, as ``<what it is>; one job: <why
it is one>.``
(``tests/test_layers.py`` checks the ``; one job: `` marker and a reason after it). A
module that is two jobs is split instead.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rayrollout.plugins import BUILT_IN_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rayrollout"

# part -> rank; a module imports only parts of rank <= its own (peers excepted below).
RANKS = {
    "errors": 0,
    "auth": 0,
    "gc_tuning": 0,
    "ports": 0,  # free ports for servers that bind later
    "figures": 0,  # the run figures the engine answers and the light client reads
    "data": 1,
    "plugins": 1,  # the entry-point mechanism of every registry: errors only
    "client": 1,  # the light HTTP client: errors and auth only, never Ray (test_client.py)
    "integrations": 2,  # trainer adapters over the client (no engine part: no peers imported)
    "envkit": 2,
    "policy": 2,
    "agentkit": 3,
    "engine": 4,
    "api": 5,
    "cli": 6,
    "__main__": 7,  # python -m rayrollout: the console script, run by a Python
}
PLUGINS = BUILT_IN_PACKAGES  # the built-in plugins' folders
PLUGIN_MAY_IMPORT = {"errors", "auth", "ports", "data", "envkit", "policy", "agentkit"}


def _part(module: str) -> str | None:
    """``rayrollout.engine.engine_actor`` -> ``engine``; the facade ``rayrollout`` -> None."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``rayrollout...`` module a file imports, at any depth, with its line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("rayrollout")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "rayrollout":
                found += [(node.lineno, f"rayrollout.{a.name}") for a in node.names]
            elif node.module.startswith("rayrollout."):
                found.append((node.lineno, node.module))
    return found


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if "tests" in rel.parts or "server" in rel.parts:
            continue  # plugin tests and the ng_run entrypoint are not part of the import graph
        name = ".".join(["rayrollout", *rel.with_suffix("").parts]).removesuffix(".__init__")
        out.append((name, path))
    return out


def _violation(importer: str, imported: str) -> str | None:
    src, dst = _part(importer), _part(imported)
    if dst is None or src == dst:
        return None
    if src in PLUGINS:
        return None if dst in PLUGIN_MAY_IMPORT else f"a plugin may not import {dst}"
    if dst in PLUGINS:
        return "the core finds plugins through the registry, never by module name"
    if src is None:  # the facade re-exports the public API
        return None if dst != "cli" else "the facade may not import the CLI"
    if src not in RANKS or dst not in RANKS:
        return f"{src if src not in RANKS else dst} is not a known part: add it to RANKS"
    if RANKS[dst] > RANKS[src]:
        return f"{src} (rank {RANKS[src]}) imports {dst} (rank {RANKS[dst]}), a higher part"
    if RANKS[dst] == RANKS[src]:
        return f"{src} and {dst} are peers and do not import each other"
    return None


def test_no_module_imports_a_higher_part_or_a_plugin_by_name():
    problems = []
    for name, path in _modules():
        for line, imported in _imports(path):
            why = _violation(name, imported)
            if why:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {imported}: {why}")
    assert not problems, "\n".join(problems)


def test_every_top_level_module_of_the_package_is_a_known_part():
    entries = {
        p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert entries - {"__init__", *PLUGINS} <= set(RANKS), entries - set(RANKS)


def test_every_part_says_what_it_may_import():
    for part in RANKS:
        init = PACKAGE / part / "__init__.py"
        module = init if init.exists() else PACKAGE / f"{part}.py"
        doc = ast.get_docstring(ast.parse(module.read_text())) or ""
        if init.exists():
            assert "May import" in doc, (
                f"{module}: its docstring says nothing of what it may import"
            )


def test_the_wheel_lists_every_package_folder():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        ".".join(("rayrollout", *p.parent.relative_to(PACKAGE).parts))
        for p in PACKAGE.rglob("__init__.py")
    }
    folders = {f.rstrip(".") for f in folders if "__pycache__" not in f}
    assert folders == listed, (
        f"missing from pyproject: {folders - listed}; stale: {listed - folders}"
    )


@pytest.mark.timeout(600)
def test_pip_install_puts_only_rayrollout_in_site_packages(tmp_path):
    target = tmp_path / "site-packages"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path,
    )
    top = {p.name for p in target.iterdir() if p.name != "bin"}
    assert {n for n in top if not n.endswith(".dist-info")} == {"rayrollout"}, top
    # The plugins and their data are inside it, importable from the installed copy alone.
    assert (target / "rayrollout/environments/weather/tasks.jsonl").is_file()
    assert (target / "rayrollout/envkit/nemo_gym/server/resources_servers").is_dir()
    probe = (
        "import rayrollout, rayrollout.environments.weather.env as w, rayrollout.deployments;"
        "print(rayrollout.__file__); print(w.__file__)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(line.startswith(str(target)) for line in shown), shown


LONG_MODULE_LINES = 400
ONE_JOB = re.compile(r"; one job: \S.{9,}")
"""The first docstring line of a long module: ``<what>; one job: <a reason, 10+ chars>``."""


def long_modules_without_a_reason(paths: list[Path]) -> list[str]:
    """Each module of ``paths`` over ``LONG_MODULE_LINES`` lines whose docstring's first
    line does not say why it is one job, with its line count and that first line."""
    missing = []
    for path in paths:
        text = path.read_text()
        lines = text.count("\n") + (not text.endswith("\n") and bool(text))
        if lines <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else ""
        if not ONE_JOB.search(first):
            missing.append(f"{path.relative_to(ROOT)} ({lines} lines): {first!r}")
    return missing


def test_every_module_over_400_lines_says_in_its_first_line_why_it_is_one_job():
    modules = [path for path in sorted(PACKAGE.rglob("*.py"))]
    long = [p for p in modules if p.read_text().count("\n") > LONG_MODULE_LINES]
    print(f"\n{len(long)} of {len(modules)} modules over {LONG_MODULE_LINES} lines")
    assert long_modules_without_a_reason(modules) == []


def test_every_benchmark_over_400_lines_says_in_its_first_line_why_it_is_one_job():
    benchmarks = sorted((ROOT / "benchmarks").glob("*.py"))
    assert long_modules_without_a_reason(benchmarks) == []


def test_the_one_job_check_refuses_a_long_module_without_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    body = "x = 1\n" * LONG_MODULE_LINES
    cases = {
        "said.py": '"""Checks; one job: every check of a run, read together."""\n' + body,
        "unsaid.py": '"""Checks before start, and more."""\n' + body,
        "empty.py": '"""Checks; one job: ."""\n' + body,
        "short.py": '"""Checks, no reason needed."""\n' + "x = 1\n" * 10,
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    found = long_modules_without_a_reason(sorted(tmp_path.glob("*.py")))
    assert [line.split(" ")[0] for line in found] == ["empty.py", "unsaid.py"]


# File names that repeat across packages, each with why the two (or more) files are one kind
# of job: a newcomer finding two ``collect.py`` knows they are the same command at two layers.
REPEATED_FILE_NAMES = {
    "__main__.py": "python -m rayrollout and python -m rayrollout.cli: one console script",
    "app.py": "the Serve or ng_run application of its package (NeMo Gym's entrypoint name)",
    "base.py": "the base class of its package's kinds (exporters, reset/step environments)",
    "client.py": "the HTTP client of its package's counterpart (the policy, a NeMo Gym server)",
    "collect.py": "one collect at two layers: the API's plan and the CLI command over it",
    "contract.py": "the contract a plugin implements: an environment's, an agent's",
    "env.py": "each built-in environment's one class",
    "errors.py": "the error tree, and the light client's errors (it installs alone)",
    "kind.py": "each built-in policy kind's entry point",
    "nemo_gym.py": "named after NeMo Gym: its agent, and its export format",
    "protocol.py": "the wire protocol of its package's counterpart",
    "registry.py": "the registry by name of environments, of agents",
    "routes.py": "the HTTP routes of a server: the service's, NeMo Gym's",
    "trl.py": "named after TRL: its export format, its trainer adapter",
    "verifiers.py": "named after verifiers: its environment name, its agent",
    "verl.py": "named after verl: its export format, its trainer adapter",
}


def test_no_two_packages_differ_only_by_a_plural():
    names = {p.parent.name for p in PACKAGE.rglob("__init__.py")}
    twins = sorted(n for n in names if f"{n}s" in names or (n.endswith("s") and n[:-1] in names))
    assert twins == [], f"packages differing only by a plural: {twins}"


def test_every_repeated_file_name_says_why():
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if path.name != "__init__.py" and "tests" not in rel.parts:
            seen.setdefault(path.name, []).append(str(rel))
    repeated = {name for name, paths in seen.items() if len(paths) > 1}
    unexplained = {name: seen[name] for name in repeated - set(REPEATED_FILE_NAMES)}
    assert not unexplained, f"repeated file names with no reason: {unexplained}"
    stale = set(REPEATED_FILE_NAMES) - repeated
    assert not stale, f"REPEATED_FILE_NAMES names files no longer repeated: {stale}"
