"""Math: arithmetic questions, a calculator tool, and answers graded by ``math_verify``.

The task is "What is <expression>?" with the gold answer in the ``expected_answer`` field
(or ``expected_result``, the name NeMo Gym's ``math_with_code`` rows use, so they verify here too).
The calculator walks the expression's ``ast`` itself (never ``eval``), so the model can only
do arithmetic, and caps exponents and magnitudes so one call cannot eat the replica's CPU.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import importlib
import logging
import operator
from collections.abc import Callable
from typing import Any, ClassVar

from rayrollout.envkit import Environment, Episode, ToolError, Verification, tool

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_KINDS = {ast.Name: "name", ast.Call: "function call", ast.Attribute: "attribute access"}
ALLOWED = "numbers, + - * / // % **, unary + -, and parentheses"


class MathEnv(Environment):
    """Arithmetic word problems with a calculator."""

    name = "math"
    default_hosting = "inline"  # the calculator is microseconds; the verifier runs in a thread
    max_expression_chars: ClassVar[int] = 500
    max_exponent: ClassVar[int] = 1000
    max_magnitude: ClassVar[float] = 1e300  # also keeps results finite as floats
    verify_timeout_s: ClassVar[float] = 10.0

    @tool
    async def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "12 * (3 + 4)".
        """
        if len(expression) > self.max_expression_chars:
            raise ToolError(f"the expression is over {self.max_expression_chars} characters")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError:
            raise ToolError(f"{expression!r} is not an arithmetic expression") from None
        value = self._evaluate(tree.body)
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)

    def _evaluate(self, node: ast.expr) -> Number:
        """Evaluate one node, refusing anything that is not plain arithmetic."""
        value = node.value if isinstance(node, ast.Constant) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            value = _UNARY[type(node.op)](self._evaluate(node.operand))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._evaluate(node.left), self._evaluate(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > self.max_exponent:
                raise ToolError(f"the exponent {right} is over the limit of {self.max_exponent}")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ToolError(f"division by zero in `{ast.unparse(node)}`") from None
            except OverflowError:
                raise ToolError(f"`{ast.unparse(node)}` is too large") from None
        else:
            kind = _KINDS.get(type(node), type(node).__name__.lower())
            raise ToolError(f"{kind} `{ast.unparse(node)}` is not allowed; use only {ALLOWED}")
        if isinstance(value, complex):  # e.g. (-8) ** 0.5
            raise ToolError(f"`{ast.unparse(node)}` is not a real number")
        if abs(value) > self.max_magnitude:
            raise ToolError(f"`{ast.unparse(node)}` is over the limit of {self.max_magnitude:g}")
        return value

    async def verify(self, episode: Episode) -> Verification:
        """Reward 1.0 when the final answer equals the gold answer mathematically."""
        gold = gold_answer(episode.task.task_id, episode.task.fields)
        if not _LOADED:
            # The process's first verifies import math_verify (see _grade) and grade one
            # symbolic pair (sympy imports a score more modules at its first comparison): off
            # the event loop, and outside the time limit below (a verify that comes while
            # another thread does this waits here for it too).
            await asyncio.to_thread(_warm_up)
            _LOADED.add("math_verify")
        grading = asyncio.to_thread(_grade, gold, episode.final_answer())
        try:
            # A thread cannot be killed, but the episode need not wait for a stuck sympy call.
            return await asyncio.wait_for(grading, self.verify_timeout_s)
        except TimeoutError:
            details = {"error": f"math_verify took over {self.verify_timeout_s} s"}
            return Verification(reward=0.0, details=details)


_LOADED: set[str] = set()
"""Holds "math_verify" once this process has imported it (``MathEnv.verify``)."""


def _warm_up() -> None:
    """Import math_verify and compare one symbolic pair: about 1.4 s of CPU, once per
    process, that the first episode's verify would otherwise spend inside its time limit."""
    importlib.import_module("math_verify")
    _grade("$x+1$", "$1+x$")


GOLD_FIELDS = ("expected_answer", "expected_result")
"""Where a task keeps its gold answer: rayrollout's name (also NeMo Gym's ``math_with_judge``),
then the one NeMo Gym's ``math_with_code`` datasets use (a number there, e.g. 32)."""


def gold_answer(task_id: str, fields: dict[str, Any]) -> str:
    """The task's gold answer as text, from the first of ``GOLD_FIELDS`` it has.

    ``expected_answer`` wins when a row has both, being the field rayrollout documents.
    """
    for name in GOLD_FIELDS:
        if fields.get(name) is not None:
            return str(fields[name])
    raise ValueError(
        f"task {task_id!r} has no 'expected_answer' field (nor NeMo Gym's 'expected_result'); "
        'math tasks need one, e.g. {"expected_answer": "84"}'
    )


class _DisabledTimeoutNotice(logging.Filter):
    """Drops math_verify's "Timeout is disabled" warning, which ``_grade`` below brings on
    deliberately (``verify`` bounds the wait itself): said once per process, it was one line
    per worker and replica in every run's log, telling the reader nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_QUIET = _DisabledTimeoutNotice()
for _name in ("math_verify.parser", "math_verify.grader"):  # the two modules that say it
    logging.getLogger(_name).addFilter(_QUIET)


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold_text: str) -> list[Any]:
    """A task's gold answer, parsed once per process: every sample of the task compares
    against it, and parsing is a third of a verify's CPU."""
    import math_verify

    return list(math_verify.parse(gold_text, parsing_timeout=None))


def _grade(gold_text: str, answer: str) -> Verification:
    """Parse and compare with math_verify, outside the event loop.

    math_verify's own timeouts use ``signal.alarm``, which raises outside the main thread
    (Ray actors, ``asyncio.to_thread``), so they are off here and ``verify`` above bounds
    the wait instead.

    math_verify is imported here, at the first verify, not with the class: with sympy it is
    about a second of CPU that every process which only looks the class up (the checks
    before a run, the demo's task list, the engine deciding where environments run) or
    plays no math episode would pay.
    """
    import math_verify

    gold = _parse_gold(gold_text)
    predicted = math_verify.parse(answer, parsing_timeout=None)
    correct = bool(gold and predicted and math_verify.verify(gold, predicted, timeout_seconds=None))
    # parse() returns [parsed value, matched text]; the parsed value is what was compared.
    return Verification(
        reward=1.0 if correct else 0.0,
        details={
            "gold": str(gold[0]) if gold else None,
            "predicted": str(predicted[0]) if predicted else None,
        },
    )
