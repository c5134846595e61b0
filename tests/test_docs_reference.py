"""The reference pages generated from the code (docs/gen_reference.py) are current and whole.

Every config field, every CLI command and option and every output column must be on its
page: a field or command added to the code without ``python docs/gen_reference.py`` fails
here, naming what is missing. The checks walk the code themselves (pydantic's fields,
typer's commands, the Arrow schema), not the generator, so a generator that skips something
fails them too.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
sys.path.insert(0, str(ROOT / "docs"))

import gen_reference  # noqa: E402


def model_in(annotation: object) -> tuple[type[BaseModel] | None, str]:
    """The pydantic model a field holds (directly, optional, in a list or a mapping) and the
    path segment its fields sit under (``''``, ``'[]'``, ``'.<name>'``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict and len(args) == 2:
        model, how = model_in(args[1])
        return model, ".<name>" + how
    if origin is list and args:
        model, how = model_in(args[0])
        return model, "[]" + how
    for arg in args:
        model, how = model_in(arg)
        if model is not None:
            return model, how
    return None, ""


def config_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of a config model, nested ones included."""
    paths = []
    for name, info in model.model_fields.items():
        paths.append(prefix + name)
        nested, how = model_in(info.annotation)
        if nested is not None:
            paths += config_paths(nested, f"{prefix}{name}{how}.")
    return paths


def missing_config_fields(page: str) -> list[str]:
    from rayrollout.data.config import RunConfig
    from rayrollout.deployments.vllm.app import VllmDeploymentConfig
    from rayrollout.policy.kinds import policy_kind, policy_kinds

    wanted = config_paths(RunConfig) + config_paths(VllmDeploymentConfig)
    for kind in policy_kinds():  # each kind's own settings, beside the common policy keys
        wanted += config_paths(policy_kind(kind).settings_model, "policy.")
    return [path for path in wanted if f"| `{path}` |" not in page]


def cli_entries() -> list[str]:
    """``'rayrollout collect'`` for every command and ``'rayrollout collect --out'`` for each
    of its visible options, from the typer app itself."""
    import typer

    from rayrollout.cli.commands import app

    entries: list[str] = []

    def walk(command: object, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:
            for name, sub in subcommands.items():
                if not sub.hidden:
                    walk(sub, [*path, name])
            return
        name = " ".join(path)
        entries.append(name)
        for param in command.params:  # type: ignore[attr-defined]
            if hasattr(param, "is_flag") and not param.hidden:
                entries.append(f"{name} {param.opts[0]}")

    walk(typer.main.get_command(app), ["rayrollout"])
    return entries


def missing_cli_entries(page: str) -> list[str]:
    sections = {block.split("`", 1)[0]: block for block in page.split("\n## `rayrollout")[1:]}
    missing = []
    for entry in cli_entries():
        command, _, option = entry.partition(" -")
        section = sections.get(command.removeprefix("rayrollout"))
        if section is None or (option and f"`-{option}" not in section):
            missing.append(entry)
    return missing


def test_the_generated_pages_are_up_to_date():
    stale = gen_reference.stale_pages()
    assert not stale, f"stale: {stale}; run python docs/gen_reference.py and commit the pages"


def test_every_config_field_is_in_the_config_reference():
    page = (REFERENCE / "config.md").read_text()
    assert missing_config_fields(page) == []


def test_every_command_and_option_is_in_the_cli_reference():
    page = (REFERENCE / "cli.md").read_text()
    assert missing_cli_entries(page) == []


def test_every_output_column_is_in_the_rows_reference():
    from rayrollout.data.schema import trajectory_arrow_schema

    page = (REFERENCE / "output-rows.md").read_text()
    assert [f for f in trajectory_arrow_schema().names if f"| `{f}` |" not in page] == []


def test_the_checks_name_a_field_or_command_missing_from_a_page():
    config = (REFERENCE / "config.md").read_text()
    gone = "| `policy.timeout_s` |"
    without = "\n".join(line for line in config.splitlines() if gone not in line)
    assert missing_config_fields(without) == ["policy.timeout_s"]
    cli = (REFERENCE / "cli.md").read_text()
    without_resume = "\n".join(line for line in cli.splitlines() if "`--resume`" not in line)
    assert missing_cli_entries(without_resume) == [
        "rayrollout collect --resume",
        "rayrollout up --resume",
    ]
    head, _, rest = cli.partition("\n## `rayrollout demo`")
    without_demo = head + rest.partition("\n## ")[1] + rest.partition("\n## ")[2]
    assert "rayrollout demo" in missing_cli_entries(without_demo)


def error_classes() -> list[type[BaseException]]:
    """Every class under ``RayrolloutError``, walked by this test itself after importing every
    module of the package: private ones (a leading underscore) and the rollout service's
    route-internal ``HttpError`` left out, as the page leaves them out."""
    import importlib
    import pkgutil

    import rayrollout
    from rayrollout.errors import RayrolloutError
    from rayrollout.plugins import BUILT_IN_PACKAGES

    plugins = tuple(f"rayrollout.{name}" for name in BUILT_IN_PACKAGES)
    for info in pkgutil.walk_packages(rayrollout.__path__, "rayrollout."):
        if info.name.endswith("__main__") or info.name.startswith(plugins):
            continue  # the built-in plugins raise the core's errors, they add none of theirs
        try:
            importlib.import_module(info.name)
        except ImportError:
            assert info.name.startswith("rayrollout.integrations."), info.name  # no trainer here
    found: dict[type[BaseException], None] = {}
    stack: list[type[BaseException]] = [RayrolloutError]
    while stack:
        cls = stack.pop()
        name = f"{cls.__module__}.{cls.__qualname__}"
        if (
            cls.__name__.startswith("_")
            or not name.startswith("rayrollout.")  # a test's own subclass (test_plugins)
            or name == "rayrollout.api.service.engine_link.HttpError"
        ):
            continue
        found[cls] = None
        stack += cls.__subclasses__()
    return list(found)


def missing_errors(page: str, classes: list[type[BaseException]]) -> list[str]:
    """The classes not drawn in the page's tree, or without their row (name and import)."""
    import rayrollout

    drawn = page.split("```text\n", 1)[1].split("```", 1)[0] if "```text\n" in page else ""
    names = {line.lstrip("│├└─ ").split(" ")[0] for line in drawn.splitlines()}
    missing = []
    for cls in classes:
        public = getattr(rayrollout, cls.__name__, None) is cls
        where = f"rayrollout.{cls.__name__}" if public else f"{cls.__module__}.{cls.__name__}"
        if cls.__name__ not in names or f"| `{cls.__name__}` | `{where}` |" not in page:
            missing.append(f"{cls.__module__}.{cls.__name__}")
    return missing


def test_every_error_class_is_on_the_errors_page():
    classes = error_classes()
    assert len(classes) >= 60  # the walk found the tree
    page = (REFERENCE / "errors.md").read_text()
    assert missing_errors(page, classes) == [], "run python docs/gen_reference.py"


def test_the_errors_check_names_a_class_missing_from_the_page():
    page = (REFERENCE / "errors.md").read_text()
    without_row = "\n".join(line for line in page.splitlines() if "| `PartError` |" not in line)
    assert missing_errors(without_row, error_classes()) == ["rayrollout.data.errors.PartError"]
    undrawn = "\n".join(line for line in page.splitlines() if "─ PartError " not in line)
    assert missing_errors(undrawn, error_classes()) == ["rayrollout.data.errors.PartError"]
