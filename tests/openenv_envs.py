"""Two OpenEnv environments written on ``openenv``'s own server classes, for the ``openenv``
source's tests (imported by module path, in the test, in worker actors and under uvicorn).

``CounterEnv`` is an ``MCPEnvironment``: its tools are FastMCP tools, listed and called by
OpenEnv's ``ListToolsAction`` / ``CallToolAction``. Each ``add`` costs 0.5 (a negative
reward); ``submit`` ends the episode with +2 when the answer is the running total, -1 when
not. ``GuessEnv`` takes a typed action (``GuessAction``, an ``int`` field): each wrong guess
scores -0.25, the right one +1 and ends it; four guesses end it too.

Served as OpenEnv serves environments: ``uvicorn openenv_envs:counter_app`` (and
``guess_app``), OpenEnv's FastAPI app from ``create_app``, holding
``OPENENV_TEST_SESSIONS`` sessions at most (16 unless set).
"""

from __future__ import annotations

import os
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class CounterEnv(MCPEnvironment):
    """Add numbers with a tool, then submit the total."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("counter")
        super().__init__(mcp)
        self.total = 0
        self._state = State(step_count=0)

        @mcp.tool()
        def add(n: int) -> int:
            """Add n to the running total; answers the new total."""
            self.total += n
            return self.total

        @mcp.tool()
        def submit(answer: int) -> str:
            """Submit the final total."""
            return "correct" if answer == self.total else f"wrong: the total is {self.total}"

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
        self.total = int(seed or 0)
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(metadata={"start": self.total})

    def _score(self, action: Any, observation: Any) -> Any:
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and isinstance(observation, CallToolObservation):
            if action.tool_name == "add":
                observation.reward = -0.5
            elif action.tool_name == "submit":
                right = action.arguments.get("answer") == self.total
                observation.reward = 2.0 if right else -1.0
                observation.done = True
        return observation

    def step(self, action: Action, timeout_s: float | None = None, **kw: Any) -> Observation:
        return self._score(action, super().step(action, timeout_s=timeout_s, **kw))

    async def step_async(
        self, action: Action, timeout_s: float | None = None, **kw: Any
    ) -> Observation:
        return self._score(action, await super().step_async(action, timeout_s=timeout_s, **kw))

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kw: Any) -> Any:
        return Observation(metadata={"error": f"not a tool call: {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


class GuessAction(Action):
    guess: int = Field(description="The number guessed, 1 to 10.")


class GuessObservation(Observation):
    feedback: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    """Guess a number from 1 to 10 (the reset seed picks it) in four guesses."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.target = 0
        self._state = State(step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kw: Any
    ) -> GuessObservation:
        self.target = (seed or 0) % 10 + 1
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="I picked a number from 1 to 10.")

    def step(
        self, action: GuessAction, timeout_s: float | None = None, **kw: Any
    ) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.target:
            return GuessObservation(feedback="Right!", reward=1.0, done=True)
        hint = "higher" if action.guess < self.target else "lower"
        done = self._state.step_count >= 4
        return GuessObservation(feedback=f"No, go {hint}.", reward=-0.25, done=done)

    @property
    def state(self) -> State:
        return self._state


class NanEnv(GuessEnv):
    """A guess whose reward is not a number."""

    def step(
        self, action: GuessAction, timeout_s: float | None = None, **kw: Any
    ) -> GuessObservation:
        return GuessObservation(feedback="?", reward=float("nan"))


SESSIONS = int(os.environ.get("OPENENV_TEST_SESSIONS", "16"))
counter_app = create_app(
    CounterEnv, CallToolAction, CallToolObservation, max_concurrent_envs=SESSIONS
)
guess_app = create_app(
    GuessEnv, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=SESSIONS
)
