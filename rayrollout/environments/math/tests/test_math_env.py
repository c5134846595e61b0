"""Math environment: the safe calculator, the math_verify verifier, tasks, and both hostings."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import pytest

from rayrollout.data.schema import FunctionCall, Message, Task, ToolCall
from rayrollout.data.tasks import parse_task_row, read_tasks
from rayrollout.environments.math.env import MathEnv
from rayrollout.envkit import Episode, ToolResult, Verification
from rayrollout.envkit.sessions import EnvSession
from rayrollout.envkit.testing import play_in_both_hostings

HERE = Path(__file__).resolve().parents[1]
TASK = Task(
    task_id="math-test",
    environment="math",
    prompt=[Message(role="user", content="What is 12 * (3 + 4)?")],
    fields={"expected_answer": "84"},
)


def call(expression: str) -> Message:
    arguments = json.dumps({"expression": expression})
    return Message(
        role="assistant",
        tool_calls=[
            ToolCall(id="c1", function=FunctionCall(name="calculator", arguments=arguments))
        ],
    )


def episode(answer: str | None, task: Task = TASK) -> Episode:
    messages = [
        *task.prompt,
        call("12 * (3 + 4)"),
        Message(role="tool", tool_call_id="c1", content="84"),
    ]
    if answer is not None:
        messages.append(Message(role="assistant", content=answer))
    return Episode(task=task, messages=messages)


async def calculate(expression: str) -> ToolResult:
    return await MathEnv(TASK).call_tool("calculator", json.dumps({"expression": expression}))


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("12 * (3 + 4)", "84"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("7 // 2", "3"),
        ("17 % 5", "2"),
        ("2 ** 10", "1024"),
        ("-(3 - 5)", "2"),
        ("+4", "4"),
        ("0.5 * 3", "1.5"),
        ("  1 + 1  ", "2"),
    ],
)
async def test_calculator_evaluates_arithmetic(expression: str, result: str):
    assert await calculate(expression) == ToolResult(content=result)


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("__import__('os').system('ls')", "function call"),
        ("abs(-3)", "function call"),
        ("x + 1", "name `x`"),
        ("(1).real", "attribute access"),
        ("'a' * 3", "constant `'a'`"),
        ("True + 1", "constant `True`"),
        ("1 < 2", "compare"),
        ("[1, 2]", "list"),
        ("lambda: 1", "lambda"),
        ("1 +", "not an arithmetic expression"),
        ("x = 1", "not an arithmetic expression"),
    ],
)
async def test_calculator_rejects_anything_but_arithmetic(expression: str, complaint: str):
    result = await calculate(expression)
    assert result.is_error
    assert complaint in result.content


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("2 ** 100000", "exponent 100000 is over the limit"),
        ("9 ** 999", "over the limit of 1e+300"),
        ("1e308 * 10", "over the limit of 1e+300"),
        ("1e200 ** 2", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1" * 600, "over 500 characters"),
    ],
)
async def test_calculator_refuses_impossible_or_huge_results(expression: str, complaint: str):
    result = await calculate(expression)
    assert result.is_error
    assert complaint in result.content


def test_calculator_schema_describes_its_argument():
    (schema,) = MathEnv.tool_schemas()
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert (
        "12 * (3 + 4)"
        in schema["function"]["parameters"]["properties"]["expression"]["description"]
    )


@pytest.mark.parametrize(
    ("answer", "reward", "predicted"),
    [
        pytest.param("The answer is \\boxed{84}.", 1.0, "84", id="boxed"),
        pytest.param("84", 1.0, "84", id="plain"),
        pytest.param("12 * (3 + 4) = 84", 1.0, "84", id="worked"),
        pytest.param("The answer is \\boxed{85}.", 0.0, "85", id="wrong"),
        pytest.param("eighty-four", 0.0, None, id="words"),
        pytest.param("", 0.0, None, id="empty"),
        pytest.param(None, 0.0, None, id="no-answer"),
    ],
)
async def test_verifier_compares_the_final_answer_with_math_verify(
    answer: str | None, reward: float, predicted: str | None
):
    verification = await MathEnv(TASK).verify(episode(answer))
    assert verification.reward == reward
    assert verification.details == {"gold": "84", "predicted": predicted}


async def test_verifier_accepts_equal_values_written_differently():
    task = TASK.model_copy(update={"fields": {"expected_answer": "3.5"}})
    for answer in ["\\boxed{3.5}", "\\boxed{\\frac{7}{2}}", "7/2"]:
        assert (await MathEnv(task).verify(episode(answer, task))).reward == 1.0


async def test_verifier_explains_a_task_without_expected_answer():
    task = TASK.model_copy(update={"fields": {"expected": "84"}})
    with pytest.raises(
        ValueError, match="no 'expected_answer' field \\(nor NeMo Gym's 'expected_re"
    ):
        await MathEnv(task).verify(episode("84", task))


@pytest.mark.parametrize(
    ("fields", "reward"),
    [
        pytest.param({"expected_result": 84}, 1.0, id="nemo-gym-number"),
        pytest.param({"expected_result": "84"}, 1.0, id="nemo-gym-text"),
        pytest.param({"expected_result": "85"}, 0.0, id="nemo-gym-wrong"),
        pytest.param({"expected_answer": "84", "expected_result": "85"}, 1.0, id="ours-wins"),
        pytest.param({"expected_answer": None, "expected_result": "84"}, 1.0, id="null-ours"),
    ],
)
async def test_verifier_reads_nemo_gyms_expected_result_too(fields: dict, reward: float):
    task = TASK.model_copy(update={"fields": fields})
    assert (
        await MathEnv(task).verify(episode("The answer is \\boxed{84}.", task))
    ).reward == reward


async def test_a_nemo_gym_math_row_verifies_with_its_expected_result():
    # The shape of NeMo Gym 0.7.0's math_with_code rows: the gold answer is a number.
    row = {
        "id": 0,
        "responses_create_params": {"input": [{"role": "user", "content": "What is 4 * 8?"}]},
        "expected_result": 32,
    }
    task = parse_task_row(row, default_environment="math")
    assert (await MathEnv(task).verify(episode("\\boxed{32}", task))).reward == 1.0


def test_verifier_works_outside_the_main_thread():
    # Ray actors and Serve replicas run user code off the main thread, where math_verify's
    # signal-based timeouts would raise.
    results: list[Verification] = []
    worker = threading.Thread(
        target=lambda: results.append(asyncio.run(MathEnv(TASK).verify(episode("84"))))
    )
    worker.start()
    worker.join(timeout=30)
    assert [r.reward for r in results] == [1.0]


async def test_every_example_task_is_solved_by_its_calculator_result():
    tasks = list(read_tasks(HERE / "tasks.jsonl"))
    assert 5 <= len(tasks) <= 10
    for task in tasks:
        match = re.fullmatch(r"What is ([0-9+\-*/%(). ]+)\?", task.prompt[-1].content or "")
        assert match, task.prompt
        result = await MathEnv(task).call_tool("calculator", json.dumps({"expression": match[1]}))
        assert result.content == task.fields["expected_answer"]
        answer = f"The answer is \\boxed{{{result.content}}}."
        assert (await MathEnv(task).verify(episode(answer, task))).reward == 1.0


async def play_small_episode(session: EnvSession) -> tuple[ToolResult, Verification]:
    result = await session.call_tool("calculator", '{"expression": "12 * (3 + 4)"}')
    return result, await session.verify(episode(f"The answer is \\boxed{{{result.content}}}."))


@pytest.mark.usefixtures("serve_session")
async def test_inline_and_serve_hosting_give_the_same_results():
    inline, served = await play_in_both_hostings(MathEnv, TASK, play_small_episode)
    assert served == inline
    assert inline == (
        ToolResult(content="84"),
        Verification(reward=1.0, details={"gold": "84", "predicted": "84"}),
    )
