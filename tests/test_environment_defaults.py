"""What an environment declares for its episodes, and who wins: the agent that plays a task
(the row's, the run's, the environment's own default, then ``tool_loop``:
``resolve_agent``), the turn limit (a ``max_turns`` the config sets, else the environment's
own, else the default: ``episode_limits``), and the progress bar counting failures as the
closing summary does. The episodes themselves are played in ``test_reset_step``,
``test_gem``, ``test_skyrl_gym`` and ``test_openenv``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from rayrollout.agentkit.registry import resolve_agent
from rayrollout.cli.progress import RunProgress
from rayrollout.data.config import EpisodeConfig, load_config
from rayrollout.data.schema import Task
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import EnvStats
from rayrollout.envkit import Environment, Episode, Verification
from rayrollout.envkit.contract import episode_limits, own_turn_limit
from rayrollout.envkit.openenv import OpenEnvEnvironment
from rayrollout.envkit.reset_step.gem import GemEnvironment
from rayrollout.envkit.reset_step.skyrl_gym import SkyrlGymEnvironment
from rayrollout.envkit.verifiers import VerifiersEnvironment


def task(agent: str | None = None, **fields: Any) -> Task:
    prompt = [{"role": "user", "content": "Play."}]
    return Task.model_validate(
        {"task_id": "t", "prompt": prompt, "environment": "e", "agent": agent, "fields": fields}
    )


class Plain(Environment):
    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=0.0)


class ByRow(Plain):
    """Chooses per row, as a source whose rows name their framework's agent would."""

    @classmethod
    def agent_for(cls, task: Task) -> str | None:
        return "simulated_user" if task.fields.get("user") else "context_budget"


@pytest.mark.parametrize(
    ("row_agent", "run_agent", "environment", "plays"),
    [
        (None, None, GemEnvironment, "reset_step"),  # the environment's own default
        (None, None, SkyrlGymEnvironment, "reset_step"),
        (None, None, OpenEnvEnvironment, "reset_step"),
        (None, None, VerifiersEnvironment, "verifiers"),
        (None, None, Plain, "tool_loop"),  # declares none: the built-in loop
        (None, None, None, "tool_loop"),  # an environment that does not resolve
        (None, "context_budget", GemEnvironment, "context_budget"),  # --agent wins
        ("program", "context_budget", GemEnvironment, "program"),  # the row wins over both
        ("tool_loop", None, OpenEnvEnvironment, "tool_loop"),
    ],
)
def test_the_row_then_the_run_then_the_environment_then_tool_loop_choose_the_agent(
    row_agent, run_agent, environment, plays
):
    assert resolve_agent(task(row_agent), run_agent, environment) == plays


def test_an_environment_may_choose_its_agent_per_row():
    assert resolve_agent(task(user=True), None, ByRow) == "simulated_user"
    assert resolve_agent(task(), None, ByRow) == "context_budget"
    assert resolve_agent(task(user=True), "tool_loop", ByRow) == "tool_loop"


class Game(Plain):
    max_turns = 20


def session(env: object) -> SimpleNamespace:
    return SimpleNamespace(env=env)  # an inline session: the instance as ``env``


def test_the_environments_own_turn_limit_replaces_the_default_only():
    default = load_config(None, {}).episode
    assert default.max_turns == 8
    assert episode_limits(default, session(Game(task()))).max_turns == 20
    assert episode_limits(default, session(Plain(task()))).max_turns == 8  # declares none
    assert episode_limits(default, SimpleNamespace()).max_turns == 8  # a Serve session
    chosen = load_config(None, {"episode": {"max_turns": 4}}).episode
    assert episode_limits(chosen, session(Game(task()))).max_turns == 4  # the config's wins
    # Asked again after reset (a game that draws its size there), the own limit still counts
    # as the default's replacement, not as the config's choice.
    first = episode_limits(default, session(Game(task())))
    assert episode_limits(first, SimpleNamespace(turn_limit=lambda: 12)).max_turns == 12
    assert first.tool_timeout_s == default.tool_timeout_s


def test_a_session_kind_of_its_own_answers_its_turn_limit_and_nonsense_is_ignored():
    assert own_turn_limit(SimpleNamespace(turn_limit=lambda: 30)) == 30
    for nonsense in (0, -1, True, "9", None):
        assert own_turn_limit(SimpleNamespace(turn_limit=lambda n=nonsense: n)) is None


def test_a_gem_game_and_a_skyrl_gym_environment_tell_their_own_limit_once_made():
    gem = GemEnvironment(task(env_id="game:GuessTheNumber-v0-hard"))
    assert gem.turn_limit() is None  # not made yet
    gem.env = SimpleNamespace(max_turns=7)  # what gem.make gives: the game keeps its limit
    assert gem.turn_limit() == 7
    gem.env = SimpleNamespace(max_turns=None)  # GEM's random games draw theirs at reset
    assert gem.turn_limit() is None
    sky = SkyrlGymEnvironment(task(env_class="gsm8k_multi_turn"))
    sky.env = SimpleNamespace(max_turns=5)
    assert episode_limits(EpisodeConfig(), session(sky)).max_turns == 5


def snapshot(statuses: dict[str, int]) -> RunSnapshot:
    stats = EnvStats(episodes=sum(statuses.values()), statuses=statuses)
    return RunSnapshot(
        elapsed_s=1.0, in_flight=0, episodes_per_s=1.0, total=stats, by_env={"e": stats}
    )


def test_the_progress_bar_counts_as_failed_what_the_summary_does():
    console = Console(width=100, record=True)
    with RunProgress(console, redirect=False) as progress:
        progress.begin(10)
        progress.update(
            snapshot({"ok": 4, "max_turns": 3, "truncated": 1, "error": 1, "timeout": 1})
        )
    line = " ".join(console.export_text().split())
    assert "failed 2" in line  # error and timeout; max_turns and truncated are scored
