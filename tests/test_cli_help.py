"""``--help`` shows every default: each option that has one says it in its row, and a flag
left out for the config to decide names the config key and the config's own default."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
import typer
from typer.core import TyperOption

from rayrollout.cli.commands import app
from rayrollout.data.config import DEFAULT_AGENT, RunConfig

# Options without a default value: left out, they mean "none" (no filter, no file, no
# endpoint), never a value --help could show.
NO_DEFAULT = {
    ("collect", "--env"),  # rows name their environment
    ("collect", "--env-url"),
    ("collect", "--base-url"),
    ("collect", "--policy-config"),
    ("collect", "--config"),
    ("demo", "--config"),
    ("status", "--config"),
    ("down", "--config"),
    ("show", "--status"),
    ("show", "--env"),
    ("show", "--min-reward"),
    ("show", "--max-reward"),
    ("env test", "-k"),
    ("env test", "--config"),
    ("env serve", "--config"),
    ("agent test", "--env"),
    ("agent test", "--tasks"),
    ("agent test", "--base-url"),
    ("agent test", "--config"),
}

# What a config key left unset means, where it is not a value of its own.
UNSET_MEANS = {"agent": DEFAULT_AGENT, "limit": "all", "ray.address": "a local Ray"}

FROM_CONFIG = re.compile(r"--config's ([\w.]+), else (.+)$")
ROW_START = re.compile(r"^│\s+(?:\*\s+)?-")

# Every command's --help, rendered wide (one row a line) and plain, in one fresh process:
# typer reads the terminal's width when it is imported.
_HELPS = """
import json
import typer
from typer.testing import CliRunner
from rayrollout.cli.commands import app

def leaves(command, path):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from leaves(sub, [*path, name])
    else:
        yield path

runner = CliRunner()
helps = {}
for path in leaves(typer.main.get_command(app), []):
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, (path, result.output)
    helps[" ".join(path)] = result.output
print(json.dumps(helps))
"""


def commands() -> dict[str, Any]:
    """Every leaf command of the app by its name (``env test``)."""
    found: dict[str, Any] = {}

    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "commands"):  # a group
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
        else:
            found[" ".join(path)] = command

    walk(typer.main.get_command(app), [])
    return found


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    env = {**os.environ, "TERMINAL_WIDTH": "250", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _HELPS], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(help_text: str, option: TyperOption) -> str:
    """The option's row of a help page: its first line and the lines wrapped under it."""
    names = sorted(option.opts, key=lambda name: not name.startswith("--"))
    head = re.compile(rf"^│\s+(?:\*\s+)?{re.escape(names[0])}(?![\w-])")
    lines = help_text.splitlines()
    for index, line in enumerate(lines):
        if head.match(line):
            kept = [line]
            for following in lines[index + 1 :]:  # to the next row or the panel's end
                if ROW_START.match(following) or following.startswith("╰"):
                    break
                kept.append(following)
            return " ".join(" ".join(part.strip(" │") for part in kept).split())
    raise AssertionError(f"no row for {names[0]} in:\n{help_text}")


def options() -> list[tuple[str, TyperOption]]:
    return [
        (name, param)
        for name, command in commands().items()
        for param in command.params
        if isinstance(param, TyperOption) and param.name != "help"
    ]


def config_default(key: str) -> Any:
    value: Any = RunConfig()
    for part in key.split("."):
        value = getattr(value, part)
    return value


def test_every_command_has_a_help_page(helps):
    assert set(helps) == set(commands())
    assert {"collect", "up", "env serve", "agent test"} <= set(helps)


@pytest.mark.parametrize(("command", "option"), options(), ids=lambda x: getattr(x, "name", x))
def test_every_option_with_a_default_shows_it(helps, command, option):
    text = row(helps[command], option)
    where = f"{command} {option.opts[0]}"
    if isinstance(option.show_default, str):
        assert f"[default: ({option.show_default})]" in text, where
    elif option.required or (option.is_flag and not option.default):
        assert "[default:" not in text, where  # a flag's default is off
    elif option.default in (None, [], ()):
        assert (command, option.opts[0]) in NO_DEFAULT, (
            f"{where} has no default on --help: give it show_default='...', or list it in "
            "NO_DEFAULT if leaving it out means none"
        )
        assert "[default:" not in text, where
    else:
        assert f"[default: {option.default}" in text, where


def test_the_options_without_a_default_are_still_options():
    known = {(command, option.opts[0]) for command, option in options()}
    assert known >= NO_DEFAULT, NO_DEFAULT - known


def test_a_default_taken_from_the_config_is_the_configs_own():
    checked = 0
    for command, option in options():
        match = FROM_CONFIG.search(str(option.show_default or ""))
        if not match:
            continue
        key, shown = match.groups()
        value = config_default(key)
        expected = UNSET_MEANS[key] if value is None else str(value)
        assert shown == expected, f"{command} {option.opts[0]}: shows {shown}, config {expected}"
        checked += 1
    assert checked >= 12  # collect's, up's and agent test's config-backed flags
