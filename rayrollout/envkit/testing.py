"""``rayrollout env test NAME``: an environment's own verifier cases, then its tool tests.

Each environment folder may hold ``verifier_cases.jsonl``, one case a line (like NeMo Gym's
``ng_test`` data)::

    {"name": "booked-the-suite", "task": {...a task row...},
     "messages": [{"role": "assistant", "tool_calls": [...]}, ...],
     "final_answer": "Booked: B1.", "expected_reward": 1.0}

A case is played inline: ``setup``, then every tool call in ``messages`` runs for real (so
a stateful environment reaches the state the episode would have; tool messages given in the
file are replaced by the real outputs), then ``final_answer`` is appended as the last
assistant message, ``verify`` scores it, and ``close`` runs. A case passes when the reward
is within ``tolerance`` of ``expected_reward``. The tool tests are the folder's ``tests/``,
run with pytest in a child process. pytest and its plugins come with the ``dev`` extra, not
with ``pip install rayrollout``: ``missing_test_packages`` names what is absent, so the
command can say what to install instead of reporting the tests as failed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rayrollout.data.schema import Message
from rayrollout.data.tasks import InvalidTaskError, parse_task_row
from rayrollout.data.validation import first_problem
from rayrollout.envkit import Environment, Episode

if TYPE_CHECKING:
    from rayrollout.data.schema import Task
    from rayrollout.envkit.sessions import EnvSession

Result = TypeVar("Result")

__all__ = [
    "CASES_FILE",
    "CaseResult",
    "VerifierCase",
    "environment_folder",
    "missing_test_packages",
    "play_in_both_hostings",
    "read_cases",
    "run_case",
    "run_tool_tests",
    "tool_tests_folder",
]

CASES_FILE = "verifier_cases.jsonl"
TEST_PACKAGES = {
    "pytest": "pytest",
    "pytest_asyncio": "pytest-asyncio",
    "pytest_timeout": "pytest-timeout",
}
"""Module -> distribution of what the tool tests run with (async tests, the ini's timeout)."""


class VerifierCase(BaseModel):
    """One line of ``verifier_cases.jsonl``: an episode and the reward it must get."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Names the case in reports; unique within the file.")
    task: dict[str, Any] = Field(description="A task row, in either format `collect` reads.")
    messages: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Chat messages after the prompt; their tool calls are run for real.",
    )
    final_answer: str | None = Field(
        default=None, description="Appended as the last assistant message."
    )
    expected_reward: float = Field(
        allow_inf_nan=False, description="The reward verify must give (any finite float)."
    )
    tolerance: float = Field(default=1e-6, ge=0.0, description="Allowed |reward - expected|.")


class CaseResult(BaseModel):
    """How one case went."""

    name: str
    line: int
    expected: float
    reward: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None


def environment_folder(env_cls: type[Environment]) -> Path:
    """The folder of the module that defines the environment (its cases and tests live there)."""
    return Path(inspect.getfile(env_cls)).resolve().parent


def read_cases(path: Path) -> list[tuple[int, VerifierCase]]:
    """Parse a cases file; raises ``ValueError`` naming the line and field of a bad case."""
    cases: list[tuple[int, VerifierCase]] = []
    for line_no, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            cases.append((line_no, VerifierCase.model_validate(json.loads(raw))))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path.name} line {line_no}: malformed JSON: {exc.msg}") from None
        except ValidationError as exc:
            field, problem, _ = first_problem(exc)
            message = f"{path.name} line {line_no}, field '{field}': {problem}"
            raise ValueError(message) from None
    return cases


async def run_case(
    env_cls: type[Environment],
    case: VerifierCase,
    line: int = 0,
    *,
    name: str | None = None,
    args: dict[str, Any] | None = None,
) -> CaseResult:
    """Play one case inline and compare its reward; failures of any kind are in ``error``.

    ``name`` is the environment's registered name (the case rows' default environment;
    the class's ``name`` label if not given) and ``args`` its constructor's keyword
    arguments (the config's ``environments.NAME.args``), as a run would build it.
    """
    result = CaseResult(name=case.name, line=line, expected=case.expected_reward)
    try:
        task = parse_task_row(
            case.task, default_environment=name or env_cls.name, source=CASES_FILE
        )
    except InvalidTaskError as exc:
        result.error = f"bad task row: {exc}"
        return result
    try:
        env = env_cls(task, **(args or {}))
    except Exception as exc:
        result.error = (
            f"building {env_cls.__name__}(task, **args) raised {type(exc).__name__}: {exc}"
        )
        return result
    messages: list[Message] = list(task.prompt)
    try:
        await env.setup()
        for raw in case.messages:
            message = Message.model_validate(raw)
            if message.role == "tool":
                continue  # replaced by the real outputs below
            messages.append(message)
            for call in message.tool_calls or []:
                output = await env.call_tool(call.function.name, call.function.arguments)
                messages.append(
                    Message(
                        role="tool",
                        tool_call_id=call.id,
                        name=call.function.name,
                        content=output.content,
                    )
                )
        if case.final_answer is not None:
            messages.append(Message(role="assistant", content=case.final_answer))
        verification = await env.verify(Episode(task=task, messages=messages))
        result.reward, result.details = verification.reward, verification.details
    except Exception as exc:
        result.error = f"raised {type(exc).__name__}: {exc}"
        return result
    finally:
        try:
            await env.close()
        except Exception as exc:
            result.error = result.error or f"close raised {type(exc).__name__}: {exc}"
    if abs(verification.reward - case.expected_reward) > case.tolerance:
        result.error = (
            f"expected reward {case.expected_reward}, got {verification.reward} "
            f"(details: {json.dumps(verification.details, default=str)[:300]})"
        )
    return result


def tool_tests_folder(env_cls: type[Environment]) -> Path | None:
    """The environment folder's ``tests/``, or None when it has none."""
    tests = environment_folder(env_cls) / "tests"
    return tests if tests.is_dir() else None


def missing_test_packages() -> list[str]:
    """The distributions the tool tests need (``TEST_PACKAGES``) this Python cannot import;
    empty when all are there (``pip install 'rayrollout[dev]'`` brings them)."""
    return [
        dist for module, dist in TEST_PACKAGES.items() if importlib.util.find_spec(module) is None
    ]


def run_tool_tests(env_cls: type[Environment], extra_args: list[str] | None = None) -> int:
    """Run the environment folder's ``tests/`` with pytest in a child process; its exit code.

    Check ``missing_test_packages`` first: without pytest the child fails with exit code 1,
    which reads as failed tests.
    """
    tests = tool_tests_folder(env_cls)
    if tests is None:
        return 0
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)]
    return subprocess.run(command + (extra_args or []), check=False).returncode


async def play_in_both_hostings(
    env_cls: type[Environment],
    task: Task,
    play: Callable[[EnvSession], Awaitable[Result]],
    replicas: int = 2,
) -> tuple[Result, Result]:
    """``play`` on an inline session, then on a Serve deployment of ``env_cls``; both results.

    Each session is set up and closed around ``play`` as an agent's episode is, so an
    environment's test shows in one call that the two hostings answer alike. The app runs
    on two replicas (a stateful session must stay on one) and is deleted afterwards; Serve
    must be running. Serve is imported here, not at the top: ``rayrollout env test`` needs
    none.
    """
    from ray import serve

    from rayrollout.auth import RouteAuth, new_token
    from rayrollout.envkit.server import environment_app
    from rayrollout.envkit.sessions import InlineSession, ServeSession

    name = f"test-{env_cls.name}"
    app = environment_app(
        f"{env_cls.__module__}:{env_cls.__qualname__}",
        num_replicas=replicas,
        auth=RouteAuth.bearer(new_token()),  # played through handles: HTTP is shut to all
    )
    # serve.run and serve.delete block until done: off the event loop the test runs on.
    handle = await asyncio.to_thread(serve.run, app, name=name, route_prefix=None)
    results = []
    try:
        for session in (
            InlineSession(env_cls, task),
            ServeSession(handle, env_cls.is_stateful(), "episode-1", task),
        ):
            await session.setup()
            try:
                results.append(await play(session))
            finally:
                await session.close()
    finally:
        await asyncio.to_thread(serve.delete, name)
    return results[0], results[1]
