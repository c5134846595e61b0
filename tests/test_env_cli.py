"""`rayrollout env test NAME`: shipped environments pass their own cases; wrong cases fail."""

import json

import pytest
from typer.testing import CliRunner

from rayrollout.cli.commands import app

runner = CliRunner()
SANDBOXED = pytest.mark.system_package("bubblewrap")  # the code environment's sandbox
SHIPPED = [
    "weather",
    "math",
    pytest.param("code", marks=SANDBOXED),
    "booking",
    "judge",
    "reasoning_gym",
]


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_environment_passes_its_verifier_cases(name):
    if name == "reasoning_gym":
        pytest.importorskip("reasoning_gym", reason="needs the [reasoning-gym] extra")
    code, output = invoke("env", "test", name, "--cases-only")
    assert code == 0, output
    assert "verifier case(s) passed" in output
    assert "FAIL" not in output


def test_a_wrong_expected_reward_fails_naming_the_case_and_its_line(tmp_path):
    task = {"prompt": "What is 6 * 7?", "expected_answer": "42"}
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        json.dumps({"name": "right", "task": task, "final_answer": "42", "expected_reward": 1})
        + "\n"
        + json.dumps(
            {"name": "mislabelled", "task": task, "final_answer": "41", "expected_reward": 1}
        )
        + "\n"
    )
    code, output = invoke("env", "test", "math", "--cases", cases, "--cases-only")
    assert code == 1
    assert "FAILED case 'mislabelled' (cases.jsonl line 2): expected reward 1.0, got 0.0" in output
    assert "'right'" not in output.split("FAILED", 1)[1]


@SANDBOXED
def test_a_case_that_raises_fails_with_the_exception(tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        json.dumps(
            {"name": "no-tests", "task": {"prompt": "x"}, "final_answer": "", "expected_reward": 0}
        )
        + "\n"
    )
    code, output = invoke("env", "test", "code", "--cases", cases, "--cases-only")
    assert code == 1
    assert "FAILED case 'no-tests' (cases.jsonl line 1): raised ValueError" in output
    assert "needs a 'tests' field" in output


def test_a_malformed_cases_file_is_named_with_its_line_and_field(tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"name": "a", "task": {"prompt": "x"}}\n')
    code, output = invoke("env", "test", "math", "--cases", cases)
    assert code == 2
    assert "cases.jsonl line 1, field 'expected_reward': Field required" in output


def test_unknown_environment_and_missing_cases_say_what_to_do(tmp_path):
    code, output = invoke("env", "test", "atlantis")
    assert code == 2 and "unknown environment 'atlantis'" in output
    code, output = invoke("env", "test", "math", "--cases", tmp_path / "none.jsonl")
    assert code == 1 and "no verifier cases for 'math': write" in output


def test_env_test_also_runs_the_environments_tool_tests():
    code, output = invoke("env", "test", "booking", "-k", "state_changes or unclear")
    assert code == 0, output
    assert "6 verifier case(s) passed" in output


def test_env_test_builds_the_environment_with_its_config_args(tmp_path):
    # GreeterEnv scores 1 only for an answer opening with its greeting (an arg, default hello).
    config = tmp_path / "run.yaml"
    config.write_text(
        "environments:\n  ahoy:\n    path: fixture_envs:GreeterEnv\n    args: {greeting: ahoy}\n"
    )
    cases = tmp_path / "cases.jsonl"
    case = {"task": {"prompt": "hi"}, "final_answer": "ahoy, bob", "expected_reward": 1}
    cases.write_text(json.dumps({"name": "greets", **case}) + "\n")
    code, output = invoke("env", "test", "ahoy", "--config", config, "--cases", cases)
    assert code == 0, output
    assert "1 verifier case(s) passed" in output
    code, output = invoke("env", "test", "fixture_envs:GreeterEnv", "--cases", cases)
    assert code == 1 and "expected reward 1.0, got 0.0" in output  # without args: hello


def test_an_environment_this_machine_cannot_run_is_one_line_naming_the_fix(monkeypatch):
    from rayrollout.environments.code import _bwrap

    which = _bwrap.shutil.which
    monkeypatch.setattr(
        _bwrap.shutil, "which", lambda name: None if name == "bwrap" else which(name)
    )
    _bwrap.check_bubblewrap.cache_clear()
    try:
        code, output = invoke("env", "test", "code")
    finally:
        _bwrap.check_bubblewrap.cache_clear()
    assert code == 1, output
    assert output.startswith("error: environment 'code' cannot run on this machine: ")
    assert len(output.splitlines()) == 1 and "(`apt-get install bubblewrap`)" in output
