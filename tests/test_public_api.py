"""The public surface is what the package docstring lists, each name documented, and one
exception tree under it."""

import re

import pytest

import rayrollout
from rayrollout import errors


def documented_names() -> set[str]:
    """The ``names`` of the package docstring's bullets (before each bullet's colon)."""
    listed = rayrollout.__doc__.split("The public names", 1)[1]
    bullets = re.split(r"\n- ", listed)[1:]
    return {name for bullet in bullets for name in re.findall(r"``(\w+)``", bullet.split(":")[0])}


DOCUMENTED = documented_names()


def test_public_names_are_the_documented_ones():
    assert set(rayrollout.__all__) == DOCUMENTED


def test_every_public_name_is_importable_and_documented():
    for name in rayrollout.__all__:
        value = getattr(rayrollout, name)
        assert value.__doc__, f"rayrollout.{name} has no docstring"


def every_exception_class() -> list[type[BaseException]]:
    """Every exception class defined in a module of the package (imported here)."""
    import importlib
    import pkgutil

    found = []
    for info in pkgutil.walk_packages(rayrollout.__path__, "rayrollout."):
        plugin = info.name.startswith(("rayrollout.environments", "rayrollout.deployments"))
        if plugin or info.name.endswith("__main__"):  # __main__ would run the CLI
            continue
        module = importlib.import_module(info.name)
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
    "rayrollout.agent.contract.EpisodeEnd",
    "rayrollout.agent.contract.OutOfTurns",
    # The gateway's HTTP answer other than 200, raised in a route and turned into that
    # answer by its middleware: control flow inside one server, never seen by a caller.
    "rayrollout.agent.gateway._HttpError",
}


def test_every_exception_joins_the_tree_under_one_boundary():
    boundaries = (
        errors.InputError,
        errors.PolicyBoundaryError,
        errors.EnvironmentBoundaryError,
        errors.OutputError,
        errors.ClusterError,
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


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("rayrollout.data.config:ConfigError", ValueError),
        ("rayrollout.data.tasks:InvalidTaskError", ValueError),
        ("rayrollout.environment.registry:UnknownEnvironmentError", LookupError),
        ("rayrollout.policy.client:PolicyError", RuntimeError),
        ("rayrollout.api.rollout_engine:EngineExistsError", RuntimeError),
        ("rayrollout.api.cluster:ServiceNotFoundError", LookupError),
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
