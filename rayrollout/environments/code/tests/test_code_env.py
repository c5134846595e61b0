"""Code environment: the sandbox's limits, the tool, the test-running verifier, both hostings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rayrollout.data.schema import FunctionCall, Message, Task, ToolCall
from rayrollout.data.tasks import read_tasks
from rayrollout.environments.code.env import CodeEnv, extract_code
from rayrollout.environments.code.sandbox import run_sandboxed
from rayrollout.envkit import Episode, ToolResult, Verification
from rayrollout.envkit.sessions import EnvSession
from rayrollout.envkit.testing import play_in_both_hostings

HERE = Path(__file__).resolve().parents[1]
TASK = Task(
    task_id="code-test",
    environment="code",
    prompt=[
        Message(role="user", content="Write a Python function `square(x)` that returns `x * x`.")
    ],
    fields={"tests": ["assert square(3) == 9", "assert square(-2) == 4"]},
)
SOLUTION = "def square(x):\n    return x * x\n"
sandboxed = pytest.mark.system_package("bubblewrap")  # skipped naming it where it is missing


def episode(answer: str, task: Task = TASK) -> Episode:
    arguments = json.dumps({"code": SOLUTION + "print(square(3))\n"})
    call = ToolCall(id="c1", function=FunctionCall(name="run_python", arguments=arguments))
    return Episode(
        task=task,
        messages=[
            *task.prompt,
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", content="exit code 0\nstdout:\n9\n\nstderr:\n"),
            Message(role="assistant", content=answer),
        ],
    )


@sandboxed
async def test_sandbox_kills_an_infinite_loop_at_the_timeout():
    result = await run_sandboxed("while True:\n    pass\n", timeout_s=0.5)
    assert result.timed_out
    assert result.exit_code is None


@sandboxed
async def test_sandbox_refuses_to_allocate_2_gib():
    result = await run_sandboxed("block = bytearray(2 * 1024**3)\nprint('allocated')\n")
    assert result.exit_code == 1
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


@sandboxed
async def test_sandbox_truncates_huge_output():
    result = await run_sandboxed("print('x' * 100_000)\n", output_bytes=1024)
    assert result.exit_code == 0
    assert result.stdout.startswith("x" * 1024 + "\n[output truncated: 100001 bytes")
    assert len(result.stdout) < 1200


@sandboxed
async def test_sandbox_deletes_its_working_directory_afterwards():
    result = await run_sandboxed(
        "import os\nopen('scratch.txt', 'w').write('hi')\nprint(os.getcwd())\n"
    )
    workdir = Path(result.stdout.strip())
    assert workdir.name.startswith("rayrollout-code-")
    assert not workdir.exists()


@sandboxed
async def test_sandbox_hides_the_parent_environment_variables(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAYROLLOUT_SECRET", "hunter2")
    result = await run_sandboxed("import os\nprint(os.environ.get('RAYROLLOUT_SECRET'))\n")
    assert result.stdout == "None\n"


@sandboxed
async def test_run_python_reports_exit_code_and_output():
    code = "import sys\nprint('hi')\nprint('oops', file=sys.stderr)\nsys.exit(3)\n"
    result = await CodeEnv(TASK).call_tool("run_python", json.dumps({"code": code}))
    assert result == ToolResult(content="exit code 3\nstdout:\nhi\n\nstderr:\noops\n")


@sandboxed
async def test_run_python_tells_the_model_it_timed_out(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(CodeEnv, "timeout_s", 0.5)
    result = await CodeEnv(TASK).call_tool("run_python", '{"code": "while True: pass"}')
    assert result == ToolResult(
        content="Error: the code ran past the 0.5 s limit and was killed", is_error=True
    )


def test_run_python_schema_describes_its_argument():
    (schema,) = CodeEnv.tool_schemas()
    assert schema["function"]["name"] == "run_python"
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert CodeEnv.default_hosting == "serve"


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        ("```python\nx = 1\n```", "x = 1\n"),
        ("Here:\n```py\nx = 1\n```\nDone.", "x = 1\n"),
        ("```\nx = 1\n```", "x = 1\n"),
        ("```python\nx = 1\n```\nbetter:\n```python\nx = 2\n```", "x = 2\n"),
        ("x = 1", "x = 1"),
    ],
)
def test_extract_code_takes_the_last_fenced_block_or_the_whole_answer(answer: str, code: str):
    assert extract_code(answer) == code


@sandboxed
@pytest.mark.parametrize(
    ("answer", "reward", "passed", "first_failure"),
    [
        pytest.param(f"```python\n{SOLUTION}```", 1.0, 2, None, id="fenced-correct"),
        pytest.param(SOLUTION, 1.0, 2, None, id="unfenced-correct"),
        pytest.param(
            "```python\ndef square(x):\n    return x * 3\n```",
            0.5,
            1,
            "assert square(-2) == 4: AssertionError",
            id="half-right",
        ),
        pytest.param(
            "```python\ndef square(x):\n    return x +\n```",
            0.0,
            0,
            "the solution failed to run: SyntaxError",
            id="syntax-error",
        ),
        pytest.param(
            "I cannot do that.",
            0.0,
            0,
            "the solution failed to run: SyntaxError",
            id="no-code",
        ),
        pytest.param(
            f"```python\n{SOLUTION}print('x' * 100_000)\n"
            "if __name__ == '__main__':\n    input()\n```",
            1.0,
            2,
            None,
            id="noisy-correct",
        ),
    ],
)
async def test_verifier_rewards_the_fraction_of_passing_tests(
    answer: str, reward: float, passed: int, first_failure: str | None
):
    verification = await CodeEnv(TASK).verify(episode(answer))
    assert verification.reward == reward
    assert verification.details["passed"] == passed
    assert verification.details["failed"] == 2 - passed
    if first_failure is None:
        assert verification.details["first_failure"] is None
    else:
        assert verification.details["first_failure"].startswith(first_failure)


@sandboxed
async def test_verifier_scores_zero_when_the_solution_hangs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(CodeEnv, "timeout_s", 0.5)
    verification = await CodeEnv(TASK).verify(episode("while True:\n    pass\n"))
    assert verification.reward == 0.0
    assert verification.details["first_failure"].startswith("the tests did not finish (timed out)")


@sandboxed
async def test_every_example_task_is_solved_by_the_function_its_prompt_describes():
    tasks = list(read_tasks(HERE / "tasks.jsonl"))
    assert 5 <= len(tasks) <= 10
    for task in tasks:
        match = re.search(
            r"`(\w+)\(([^`]*)\)` that returns `([^`]+)`", task.prompt[-1].content or ""
        )
        assert match, task.prompt
        name, params, expression = match.groups()
        answer = f"```python\ndef {name}({params}):\n    return {expression}\n```"
        verification = await CodeEnv(task).verify(episode(answer, task))
        assert verification.reward == 1.0, (task.task_id, verification.details)


async def play_small_episode(session: EnvSession) -> tuple[ToolResult, Verification]:
    result = await session.call_tool(
        "run_python", json.dumps({"code": SOLUTION + "print(square(3))"})
    )
    return result, await session.verify(episode(f"```python\n{SOLUTION}```"))


@sandboxed
@pytest.mark.usefixtures("serve_session")
async def test_inline_and_serve_hosting_give_the_same_results():
    inline, served = await play_in_both_hostings(CodeEnv, TASK, play_small_episode)
    assert served == inline
    assert inline[0].content == "exit code 0\nstdout:\n9\n\nstderr:\n"
    assert inline[1].reward == 1.0


async def test_run_python_names_the_fix_when_bubblewrap_is_missing(monkeypatch: pytest.MonkeyPatch):
    from rayrollout.environments.code import _bwrap

    which = _bwrap.shutil.which
    monkeypatch.setattr(
        _bwrap.shutil, "which", lambda name: None if name == "bwrap" else which(name)
    )
    _bwrap.check_bubblewrap.cache_clear()
    try:
        result = await CodeEnv(TASK).call_tool("run_python", '{"code": "print(1)"}')
    finally:
        _bwrap.check_bubblewrap.cache_clear()
    assert result.is_error
    assert (
        "`apt-get install bubblewrap`" in result.content
        and "never run unsandboxed" in result.content
    )


def test_the_environment_says_before_a_run_that_it_cannot_run_without_bubblewrap(
    monkeypatch: pytest.MonkeyPatch,
):
    from rayrollout.environments.code import _bwrap

    which = _bwrap.shutil.which
    monkeypatch.setattr(
        _bwrap.shutil, "which", lambda name: None if name == "bwrap" else which(name)
    )
    _bwrap.check_bubblewrap.cache_clear()
    try:
        reason = CodeEnv.unavailable_reason()
    finally:
        _bwrap.check_bubblewrap.cache_clear()
    assert reason is not None and "(`apt-get install bubblewrap`)" in reason


@sandboxed
def test_the_environment_says_it_can_run_where_the_sandbox_starts():
    assert CodeEnv.unavailable_reason() is None
