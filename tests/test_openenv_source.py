"""The ``openenv`` source without OpenEnv's servers: its settings, the extra it names when
``openenv`` is missing, ``env list``, and the scripted policy's tool-call replies that the
OpenEnv tests play MCP tools with (``test_openenv`` plays the environments themselves)."""

import asyncio
import importlib.util
import json

import pytest
from typer.testing import CliRunner

from rayrollout.cli.commands import app
from rayrollout.data.schema import Task
from rayrollout.deployments.scripted.strategy import next_action
from rayrollout.envkit.openenv import OpenEnvEnvironment, OpenEnvError
from rayrollout.envkit.openenv.actions import json_action, observation_text, tool_output
from rayrollout.envkit.openenv.channel import ActionRejected
from rayrollout.envkit.openenv.socket import socket_url
from rayrollout.envkit.reset_step import ResetStepError
from rayrollout.errors import EnvironmentBoundaryError


def task(**fields):
    prompt = [{"role": "user", "content": "Play."}]
    return Task.model_validate(
        {"task_id": "t", "prompt": prompt, "environment": "openenv", "fields": fields}
    )


@pytest.mark.parametrize("args", [{}, {"url": "http://h:1", "env_class": "m:C"}])
def test_exactly_one_of_url_and_env_class(args):
    with pytest.raises(OpenEnvError, match="exactly one of 'url'"):
        OpenEnvEnvironment(task(), **args)


def test_the_rows_seed_and_reset_kwargs_win_over_the_args():
    env = OpenEnvEnvironment(task(seed=7), url="http://h:1", seed=1, reset_kwargs={"level": 2})
    assert env.reset_data == {"level": 2, "seed": 7}
    row = task(reset_kwargs={"level": 5})
    assert OpenEnvEnvironment(row, url="http://h:1", seed=1).reset_data == {"level": 5, "seed": 1}


def test_by_class_without_openenv_names_the_extra():
    if importlib.util.find_spec("openenv") is not None:
        pytest.skip("openenv is installed here")
    env = OpenEnvEnvironment(task(), env_class="my_envs:GuessEnv")
    with pytest.raises(OpenEnvError, match=r"pip install 'rayrollout\[openenv\]'"):
        asyncio.run(env.setup())


def test_errors_join_the_tree():
    assert issubclass(OpenEnvError, ResetStepError)
    assert issubclass(ActionRejected, EnvironmentBoundaryError)


def test_socket_urls():
    assert socket_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws"
    assert socket_url("https://h/env/") == "wss://h/env/ws"
    assert socket_url("ws://h:1/ws") == "ws://h:1/ws"


def test_actions_and_observations():
    assert json_action('Here:\n```json\n{"guess": 3}\n```') == {"guess": 3}
    with pytest.raises(ActionRejected, match="not one JSON object"):
        json_action("[3]")
    assert observation_text({"feedback": "higher", "metadata": {"x": 1}}) == "higher"
    assert observation_text({"board": [1, 2], "turn": 3}) == '{"board":[1,2],"turn":3}'
    text = {"tool_name": "add", "result": {"content": [{"type": "text", "text": "7"}]}}
    assert tool_output(text) == "7"
    error = {"tool_name": "add", "error": {"error_type": "timeout", "message": "slow"}}
    assert tool_output(error) == "Error (timeout): slow"
    assert tool_output({"tool_name": "x", "result": {"content": [], "data": [1]}}) == "[1]"


def test_env_list_shows_openenv_with_its_source():
    result = CliRunner().invoke(app, ["env", "list"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if " openenv " in line)
    assert "OpenEnv" in line
    assert any("skyrl-gym" in line for line in result.output.splitlines())


def test_the_scripted_policy_calls_the_tools_a_prompt_scripts():
    replies = [{"tool": "add", "arguments": {"n": 4}}, "Done."]
    messages = [{"role": "system", "content": f"Play. [[replies={json.dumps(replies)}]]"}]
    first = next_action(messages, [])
    assert (first.tool, json.loads(first.arguments)) == ("add", {"n": 4})
    messages += [{"role": "assistant", "content": None}, {"role": "tool", "content": "7"}]
    assert next_action(messages, []).text == "Done."
    broken = [{"role": "user", "content": 'Hi [[replies=[{"arguments": {}}]]]'}]
    assert next_action(broken, []).text.startswith("I have no tools")  # no tool name: ignored


def test_a_missing_class_is_found_in_the_source_without_running_the_module(tmp_path, monkeypatch):
    from rayrollout.envkit.openenv.checks import class_problem

    (tmp_path / "slow_envs.py").write_text(
        "raise RuntimeError('importing me is slow and fails')\n\nclass GuessEnv:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    line = class_problem("slow_envs:GuesEnv", "env_class", "builtins:object")
    assert line == (
        "OpenEnv env_class 'slow_envs:GuesEnv': module 'slow_envs' has no 'GuesEnv'; did you "
        "mean 'slow_envs:GuessEnv'?"
    )
    line = class_problem("no_such_envs:GuessEnv", "env_class", "builtins:object")
    assert "cannot be imported: ModuleNotFoundError: No module named 'no_such_envs'" in line


def test_a_module_that_makes_its_names_at_run_time_is_imported_to_be_checked(tmp_path, monkeypatch):
    from rayrollout.envkit.openenv.checks import class_problem

    (tmp_path / "lazy_envs.py").write_text(
        "def __getattr__(name):\n    if name == 'GuessEnv':\n        return type(name, (), {})\n"
        "    raise AttributeError(name)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert class_problem("lazy_envs:GuessEnv", "env_class", "builtins:object") is None
    assert "is not a subclass of OpenEnv's int" in class_problem(
        "lazy_envs:GuessEnv", "env_class", "builtins:int"
    )
