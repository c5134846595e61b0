"""A classic verifiers ``ToolEnv`` for the verifiers agent's tests: one tool, one rubric.

``verifiers.load_environment("verifiers_envs")`` imports this module (tests/ is on the
workers' path) and calls ``load_environment``. The rubric pays 2.0 for the right product in
the final answer and takes 0.5 off per tool call, so rewards leave [0, 1].
"""

import verifiers as vf
from datasets import Dataset


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def right_product(completion, answer) -> float:
    """2.0 when the last assistant message names the answer, else 0.0."""
    last = next((m for m in reversed(completion) if m["role"] == "assistant"), None)
    return 2.0 if last is not None and answer in str(last.get("content") or "") else 0.0


def tool_calls(completion) -> float:
    """How many tool calls the model made."""
    return float(
        sum(len(m.get("tool_calls") or []) for m in completion if m["role"] == "assistant")
    )


def load_environment(max_turns: int = 4) -> vf.Environment:
    rubric = vf.Rubric(funcs=[right_product, tool_calls], weights=[1.0, -0.5])
    dataset = Dataset.from_list([{"question": "What is 6 times 7?", "answer": "42"}])
    return vf.ToolEnv(tools=[multiply], max_turns=max_turns, rubric=rubric, dataset=dataset)
