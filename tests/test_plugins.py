"""One mechanism finds every plugin by name: entry points, duplicates refused, names resolved
in one order, targets imported only when asked for. The environment, agent and policy-kind
registries are each one ``PluginGroup`` of it."""

from __future__ import annotations

import inspect
import sys
from importlib.metadata import EntryPoint

import pytest

from rayrollout import plugins
from rayrollout.errors import InputError
from rayrollout.plugins import PluginGroup

GROUP = "rayrollout.test_widgets"


class UnknownWidget(InputError, LookupError):
    pass


class TwoWidgets(UnknownWidget):
    pass


@pytest.fixture
def widgets(monkeypatch):
    """A group whose entry points are the list ``widgets.entries`` (set by the test)."""
    entries: list[EntryPoint] = []
    monkeypatch.setattr(
        plugins, "entry_points", lambda group: [e for e in entries if e.group == group]
    )
    group = PluginGroup(
        "widget",
        GROUP,
        unknown=UnknownWidget,
        duplicate=TwoWidgets,
        settings_key="widgets",
        built_in={"plain": "json:dumps"},
    )
    group.entries = entries  # type: ignore[attr-defined]
    return group


def entry(name: str, target: str, group: str = GROUP) -> EntryPoint:
    return EntryPoint(name, target, group)


def test_a_name_registered_twice_with_two_targets_is_an_error_naming_both(widgets):
    widgets.entries += [entry("w", "json:dumps"), entry("w", "json:loads")]
    with pytest.raises(TwoWidgets) as raised:
        widgets.registered()
    message = str(raised.value)
    assert "widget 'w' is registered twice under the 'rayrollout.test_widgets'" in message
    assert "'json:dumps'" in message and "'json:loads'" in message


def test_the_same_target_registered_twice_is_one_registration(widgets):
    widgets.entries += [entry("w", "json:dumps"), entry("w", "json:dumps")]
    assert widgets.registered()["w"].target == "json:dumps"


def test_an_entry_point_cannot_take_a_built_in_name(widgets):
    widgets.entries.append(entry("plain", "json:loads"))
    with pytest.raises(TwoWidgets, match=r"'json:dumps' \(built in\) and 'json:loads'"):
        widgets.registered()


def test_other_groups_entry_points_are_not_read(widgets):
    widgets.entries.append(entry("w", "json:dumps", group="rayrollout.other"))
    assert set(widgets.registered()) == {"plain"}


def test_a_name_resolves_config_path_then_registration_then_its_own_path(widgets):
    widgets.entries.append(entry("w", "json:dumps"))
    assert widgets.resolve("w").target == "json:dumps"
    assert widgets.resolve("w").origin == "entry point"
    assert widgets.resolve("w", "json:dumps").origin == "config widgets.w.path"
    assert widgets.resolve("other", "json:loads").target == "json:loads"
    assert widgets.resolve("json:loads").origin == "its 'module:Class' name"


def test_a_config_path_pointing_a_registered_name_elsewhere_is_an_error(widgets):
    widgets.entries.append(entry("w", "json:dumps"))
    with pytest.raises(TwoWidgets) as raised:
        widgets.resolve("w", "json:loads")
    message = str(raised.value)
    assert "'json:dumps'" in message and "widgets.w.path names 'json:loads'" in message


def test_an_unknown_name_lists_the_registered_ones_and_how_to_register(widgets):
    widgets.entries.append(entry("w", "json:dumps"))
    with pytest.raises(UnknownWidget) as raised:
        widgets.resolve("nope")
    assert str(raised.value) == (
        "unknown widget 'nope'. Registered: plain, w. Register it under the "
        "'rayrollout.test_widgets' entry point, set widgets.nope.path in the config, or name "
        "it as 'module:Class'"
    )


def test_a_group_without_paths_takes_registered_names_only(monkeypatch):
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    kinds = PluginGroup("kind", GROUP, unknown=UnknownWidget, by_path=False, registers="a Kind")
    with pytest.raises(UnknownWidget) as raised:
        kinds.resolve("json:dumps")
    assert str(raised.value) == (
        "unknown kind 'json:dumps'. Registered: none. Register a Kind under the "
        "'rayrollout.test_widgets' entry point"
    )


def test_a_target_is_imported_only_when_loaded_and_once(widgets, tmp_path, monkeypatch):
    (tmp_path / "widget_probe_module.py").write_text("class Widget:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "widget_probe_module", raising=False)
    widgets.entries.append(entry("probe", "widget_probe_module:Widget"))

    found = widgets.resolve("probe")
    assert "widget_probe_module" not in sys.modules  # found by name, not imported
    loaded = widgets.load(found.target)
    assert loaded.__name__ == "Widget" and "widget_probe_module" in sys.modules
    del sys.modules["widget_probe_module"]
    assert widgets.load(found.target) is loaded  # kept: not imported a second time
    widgets.clear()
    assert widgets.load(found.target) is not loaded  # forgotten: imported again


@pytest.mark.parametrize(
    ("target", "name", "says"),
    [
        ("no_such_module_here:Widget", None, "cannot import widget 'no_such_module_here:Widget'"),
        ("json:NoSuchThing", None, "cannot import widget 'json:NoSuchThing'"),
        (":Widget", None, "cannot import widget ':Widget'"),
        ("json:NoSuchThing", "w", "cannot import widget 'w' from 'json:NoSuchThing'"),
    ],
    ids=["missing-module", "missing-attribute", "empty-module", "named"],
)
def test_a_target_that_does_not_import_is_refused_by_name(widgets, target, name, says):
    with pytest.raises(UnknownWidget, match=f"^{says}: "):
        widgets.load(target, name)


def test_every_registry_is_one_plugin_group_and_reads_no_entry_point_itself():
    from rayrollout.agentkit import registry as agents
    from rayrollout.envkit import registry as environments
    from rayrollout.policy import kinds

    groups = {
        agents.AGENTS: "rayrollout.agents",
        environments.ENVIRONMENTS: "rayrollout.environments",
        kinds.POLICY_KINDS: "rayrollout.policies",
    }
    for group, name in groups.items():
        assert isinstance(group, PluginGroup) and group.group == name
    for module in (agents, environments, kinds):
        source = inspect.getsource(module)
        assert "entry_points" not in source and "import_module" not in source, module


def test_the_registries_find_the_packages_own_plugins():
    from rayrollout.agentkit.registry import AGENTS
    from rayrollout.envkit.registry import ENVIRONMENTS
    from rayrollout.policy.kinds import POLICY_KINDS

    assert {"weather", "math"} <= set(ENVIRONMENTS.registered())
    assert "tool_loop" in AGENTS.registered()
    assert {"openai", "scripted", "vllm"} <= set(POLICY_KINDS.registered())
