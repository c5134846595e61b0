"""Code: write a Python function; the reward is the fraction of the task's tests it passes.

The task is "Write a Python function `<name>(<args>)` that returns `<expression>`." with
assert statements in the ``tests`` field. Both the ``run_python`` tool and the verifier run
code in a fresh bubblewrap sandbox under a uid of its own (see ``sandbox.py``); where none
can start, ``unavailable_reason`` says so before a run starts (``collect`` stops, the demo
leaves the environment out), a tool call fails with the fix named, and nothing runs
unsandboxed.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from rayrollout.envkit import Environment, Episode, ToolError, Verification, tool

from .sandbox import SandboxUnavailableError, check_bubblewrap, run_sandboxed

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)
_SUMMARY = "__rayrollout_tests__ "

# Runs the solution, then each assert in its own try/except, with their prints silenced so
# that the summary is the last stdout line and the output cap cannot cut it off.
_HARNESS = """\
import contextlib, json, os
failures = []
with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
    scope = {"__name__": "solution"}  # skip the answer's `if __name__ == "__main__":` demo
    try:
        exec(compile(SOLUTION, "solution.py", "exec"), scope)
    except BaseException as exc:
        failures = [f"the solution failed to run: {type(exc).__name__}: {exc}"] * len(TESTS)
    else:
        for test in TESTS:
            try:
                exec(compile(test, "test.py", "exec"), scope)
            except BaseException as exc:
                failures.append(f"{test}: {type(exc).__name__}" + (f": {exc}" if str(exc) else ""))
print(MARKER + json.dumps({"failed": len(failures), "first_failure": next(iter(failures), None)}))
"""


class CodeEnv(Environment):
    """Write a small Python function that passes the task's asserts."""

    name = "code"
    default_hosting = "serve"  # subprocesses cost CPU and memory: keep them off the agents
    timeout_s: ClassVar[float] = 5.0
    memory_bytes: ClassVar[int] = 512 * 1024 * 1024

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """The sandbox's own check (bubblewrap installed, root, namespaces allowed): where
        it fails, every tool call and verification would fail with the same message."""
        try:
            check_bubblewrap()
        except SandboxUnavailableError as exc:
            return str(exc)
        return None

    @tool
    async def run_python(self, code: str) -> str:
        """Run a Python script in a fresh sandboxed interpreter and see its output.

        Args:
            code: The whole script; print what you want to see. Limits: 5 s, 512 MiB, 8 KiB
                of output per stream.
        """
        try:
            result = await run_sandboxed(code, self.timeout_s, self.memory_bytes)
        except (
            SandboxUnavailableError
        ) as exc:  # the model cannot fix this; the message says who can
            raise ToolError(f"the code sandbox is unavailable: {exc}") from exc
        if result.timed_out:
            raise ToolError(f"the code ran past the {self.timeout_s:g} s limit and was killed")
        return result.report()

    async def verify(self, episode: Episode) -> Verification:
        """Reward = the fraction of the task's asserts that pass after the answer's code."""
        tests = episode.task.fields.get("tests")
        if not isinstance(tests, list) or not tests:
            raise ValueError(
                f"task {episode.task.task_id!r} needs a 'tests' field: a list of assert "
                'statements, e.g. ["assert square(3) == 9"]'
            )
        solution = extract_code(episode.final_answer())
        harness = (
            f"SOLUTION = {solution!r}\nTESTS = {[str(t) for t in tests]!r}\n"
            f"MARKER = {_SUMMARY!r}\n{_HARNESS}"
        )
        result = await run_sandboxed(harness, self.timeout_s, self.memory_bytes)
        lines = [line for line in result.stdout.splitlines() if line.startswith(_SUMMARY)]
        if not lines:
            why = "timed out" if result.timed_out else f"exit code {result.exit_code}"
            error = f"the tests did not finish ({why}): {result.stderr[-500:]}".strip()
            details = {"passed": 0, "failed": len(tests), "first_failure": error}
            return Verification(reward=0.0, details=details)
        summary = json.loads(lines[-1].removeprefix(_SUMMARY))
        passed = len(tests) - summary["failed"]
        return Verification(
            reward=passed / len(tests),
            details={
                "passed": passed,
                "failed": summary["failed"],
                "first_failure": summary["first_failure"],
            },
        )


def extract_code(answer: str) -> str:
    """The last fenced code block of an answer (models put the final version last), or the
    whole answer when it has no fence."""
    blocks = _FENCE.findall(answer)
    return blocks[-1] if blocks else answer
