"""One public surface: what the docs use imports from ``rayrollout`` (or the light
``rayrollout.client``), every public name is documented and used by the docs, each resolves,
and every exception joins one tree under it."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rayrollout
from rayrollout import errors

ROOT = Path(__file__).resolve().parents[1]

# The pages a user reads and the examples a user copies. docs/reference/python-api.md and
# errors.md are left out: they are generated from ``__all__`` and the error tree themselves,
# so they cannot tell what the docs use.
DOC_FILES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").rglob("*.py")]
)
GENERATED = {ROOT / "docs" / "reference" / name for name in ("python-api.md", "errors.md")}
DOC_FILES = [p for p in DOC_FILES if p not in GENERATED]

# Plugins (rayrollout/deployments/, environments/ and agents/) are packages of their
# own that the core finds by name; an example may use one (a model builder of a deployment).
PLUGINS = ("rayrollout.deployments", "rayrollout.environments", "rayrollout.agents")
# Trainer adapters: one public module per trainer, each importable only beside its trainer.
ADAPTERS = "rayrollout.integrations."

# Public, and listed on the Python API page, but no guide or example uses them yet.
REFERENCE_ONLY = {"load_config", "read_tasks"}

FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"^```[^\n]*\n.*?^```|`[^`\n]+`", re.MULTILINE | re.DOTALL)
QUALIFIED = re.compile(r"\brayrollout((?:\.[a-z_][a-z0-9_]*)+)\.([A-Za-z_]\w*)")


def documented_names() -> set[str]:
    """The ``names`` of the package docstring's bullets (before each bullet's colon)."""
    listed = rayrollout.__doc__.split("The public names", 1)[1].split("\n\n")[1]
    bullets = re.split(r"\n- ", "\n" + listed)[1:]
    return {name for bullet in bullets for name in re.findall(r"``(\w+)``", bullet.split(":")[0])}


def python_sources(path: Path) -> list[tuple[int, str]]:
    """The Python a reader copies from a file, with its first line: an example whole, a
    page's ``python`` blocks."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return [(1, text)]
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in FENCE.finditer(text)]


def doc_imports() -> list[tuple[str, str, list[str]]]:
    """Every import of rayrollout in the docs and examples: (where, module, names)."""
    found = []
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT  # a page may `await` at the top
    for path in DOC_FILES:
        for first, source in python_sources(path):
            for node in ast.walk(compile(source, str(path), "exec", flags=flags)):
                if isinstance(node, ast.ImportFrom):
                    modules = [(node.module or "", [a.name for a in node.names])]
                elif isinstance(node, ast.Import):
                    modules = [(a.name, []) for a in node.names]
                else:
                    continue
                where = f"{path.relative_to(ROOT)}:{first + node.lineno - 1}"
                found += [(where, m, names) for m, names in modules if m.startswith("rayrollout")]
    return found


def test_the_public_names_are_the_documented_ones():
    assert len(rayrollout.__all__) == len(set(rayrollout.__all__))
    assert set(rayrollout.__all__) == documented_names() | set(rayrollout._ERROR_HOMES)
    assert set(rayrollout._HOMES) == set(rayrollout.__all__)


def test_every_public_name_resolves_and_has_a_docstring():
    for name in rayrollout.__all__:
        value = getattr(rayrollout, name)
        assert value.__doc__, f"rayrollout.{name} has no docstring"
        assert value.__name__ == name, f"rayrollout.{name} is {value!r}"


def test_the_docs_import_only_public_names():
    import rayrollout.client

    public = {
        "rayrollout": set(rayrollout.__all__),
        "rayrollout.client": set(rayrollout.client.__all__),
    }
    imports = doc_imports()
    assert any(module == "rayrollout" for _, module, _ in imports)  # the scan finds them
    problems = []
    for where, module, names in imports:
        if module.startswith(PLUGINS) or module.startswith(ADAPTERS):
            continue
        if module not in public:
            problems.append(f"{where}: imports {module}: import from rayrollout instead")
        elif not names:
            problems.append(f"{where}: import {module}: use 'from {module} import NAME'")
        else:
            problems += [
                f"{where}: {name} is not public in {module}"
                for name in names
                if name not in public[module]
            ]
    assert not problems, "\n".join(problems)


def test_the_docs_name_public_things_by_their_public_path():
    """``rayrollout.agentkit.EpisodeEnd`` in a page tells a reader to import an internal
    module: a public name is written ``rayrollout.EpisodeEnd``."""
    problems = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for match in QUALIFIED.finditer(text):
            module, name = "rayrollout" + match.group(1), match.group(2)
            if name in rayrollout.__all__ and not module.startswith(PLUGINS):
                line = text[: match.start()].count("\n") + 1
                problems.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)}")
    assert not problems, "write rayrollout.NAME:\n" + "\n".join(problems)


def test_every_public_name_is_used_by_the_docs():
    """The other way round: a public name no page or example shows is surface nobody was
    told about (the REFERENCE_ONLY ones are on the Python API page only)."""
    code = "\n".join(
        m.group(0) for path in DOC_FILES for m in CODE.finditer(path.read_text(encoding="utf-8"))
    )
    code += "\n".join(p.read_text() for p in DOC_FILES if p.suffix == ".py")
    used = {name for name in rayrollout.__all__ if re.search(rf"(?<!\w){name}(?!\w)", code)}
    # The rest of the error tree is told about on its own page (docs/reference/errors.md).
    assert set(rayrollout.__all__) - used - set(rayrollout._ERROR_HOMES) == REFERENCE_ONLY
    assert REFERENCE_ONLY <= set(rayrollout.__all__)


def test_importing_the_package_and_the_client_loads_no_ray():
    code = (
        "import sys, rayrollout, rayrollout.client; "
        "print(sorted(m for m in ('ray', 'pyarrow', 'pandas') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def every_exception_class() -> list[type[BaseException]]:
    """Every exception class defined in a module of the package (imported here)."""
    import importlib
    import pkgutil

    found = []
    for info in pkgutil.walk_packages(rayrollout.__path__, "rayrollout."):
        plugin = info.name.startswith(("rayrollout.environments", "rayrollout.deployments"))
        if plugin or info.name.endswith("__main__"):  # __main__ would run the CLI
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            if info.name.startswith(ADAPTERS):  # its trainer is not installed here
                continue
            raise
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == info.name
            ):
                found.append(value)
    return found


# Control flow between an agent and the engine, never raised past the episode: the engine
# turns them into the trajectory's status; not errors a caller sees.
NOT_ERRORS = {
    "rayrollout.agentkit.contract.EpisodeEnd",
    "rayrollout.agentkit.contract.OutOfTurns",
    # The gateway's HTTP answer other than 200, raised in a route and turned into that
    # answer by its middleware: control flow inside one server, never seen by a caller.
    "rayrollout.agentkit.gateway._HttpError",
    # The same for the rollout service's routes (rayrollout/api/service/routes.py).
    "rayrollout.api.service.engine_link.HttpError",
    # A worker that no longer holds its session, raised and caught in the engine actor's
    # session loop, which opens a new session: control flow inside one actor.
    "rayrollout.engine.engine_actor._SessionLost",
}


def test_every_exception_joins_the_tree_under_one_boundary():
    boundaries = (
        errors.InputError,
        errors.PolicyBoundaryError,
        errors.EnvironmentBoundaryError,
        errors.OutputError,
        errors.ClusterError,
        errors.EpisodesFailedError,
    )
    classes = [
        cls
        for cls in every_exception_class()
        if f"{cls.__module__}.{cls.__name__}" not in NOT_ERRORS
    ]
    assert len(classes) >= 20
    for cls in classes:
        if cls.__module__ == "rayrollout.errors":
            continue
        assert issubclass(cls, errors.RayrolloutError), cls
        assert sum(issubclass(cls, base) for base in boundaries) == 1, cls


def test_every_public_error_imports_from_rayrollout():
    """One place for "what can this raise": each class of the tree is ``rayrollout.NAME``,
    except private ones, control flow (NOT_ERRORS) and the CLI's own (the facade may not
    import the CLI, which prints them)."""
    tree = [cls for cls in every_exception_class() if issubclass(cls, errors.RayrolloutError)]
    public = [
        cls
        for cls in tree
        if not cls.__name__.startswith("_")
        and f"{cls.__module__}.{cls.__name__}" not in NOT_ERRORS
        and not cls.__module__.startswith("rayrollout.cli.")
    ]
    assert len(public) >= 60
    wrong = [
        f"{cls.__module__}.{cls.__name__}"
        for cls in public
        if getattr(rayrollout, cls.__name__, None) is not cls
    ]
    assert not wrong, f"add to rayrollout._ERROR_HOMES (and __all__): {wrong}"
    stale = set(rayrollout._ERROR_HOMES) - {cls.__name__ for cls in public}
    assert not stale, f"in rayrollout._ERROR_HOMES but not an error class of the tree: {stale}"


def test_every_public_error_lives_in_its_layers_errors_module():
    """A leaf class lives beside its base (``rayrollout/errors.py``) or in its part's one
    exceptions module (``rayrollout/<part>/errors.py``), so a layer's errors read as one list."""
    public = [
        cls
        for cls in every_exception_class()
        if issubclass(cls, errors.RayrolloutError)
        and not cls.__name__.startswith("_")
        and f"{cls.__module__}.{cls.__name__}" not in NOT_ERRORS
    ]
    homes = {cls.__module__ for cls in public}
    assert {"rayrollout.errors", "rayrollout.policy.errors", "rayrollout.envkit.errors"} <= homes
    elsewhere = [
        f"{cls.__module__}.{cls.__name__}"
        for cls in public
        if cls.__module__ != "rayrollout.errors"
        and not (cls.__module__.count(".") == 2 and cls.__module__.endswith(".errors"))
    ]
    assert not elsewhere, f"move to rayrollout/<part>/errors.py (re-export it): {elsewhere}"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("rayrollout.data.config:ConfigError", ValueError),
        ("rayrollout.data.tasks:InvalidTaskError", ValueError),
        ("rayrollout.envkit.registry:UnknownEnvironmentError", LookupError),
        ("rayrollout.policy.client:PolicyError", RuntimeError),
        ("rayrollout.api.rollout_engine:EngineExistsError", RuntimeError),
        ("rayrollout.api.cluster:NotUpError", LookupError),
    ],
)
def test_an_exception_keeps_the_builtin_base_callers_catch(name, builtin):
    import importlib

    module, _, attribute = name.partition(":")
    assert issubclass(getattr(importlib.import_module(module), attribute), builtin)


def test_input_errors_exit_2_and_the_rest_1():
    assert errors.exit_code(errors.InputError("bad flag")) == 2
    assert errors.exit_code(errors.OutputError("locked")) == 1
    assert errors.exit_code(errors.ClusterError("taken")) == 1
