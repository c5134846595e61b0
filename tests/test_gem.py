"""GEM's own environments through ``collect`` with no flags beyond the environment's name
(the ``gem`` source, played by its default agent ``reset_step``, within the game's own turn
limit): game:GuessTheNumber-v0-easy, seeded per row, and a hard game given 12 turns, past
the run's default of 8. Each row's rewards must equal GEM's own when the game is reset with
the same seed and stepped by hand with the same actions, the -0.1 of an answer without a
guess included.

The scripted policy plays the model: each row's system prompt carries
``[[replies=[...]]]``, the k-th reply its k-th action (the last one again past the end).
"""

import json
import math

import pytest
from cli_run import collect_rows

gem = pytest.importorskip("gem", reason="GEM is not installed: pip install 'rayrollout[gem]'")

from rayrollout import read_trajectories  # noqa: E402

SOURCE = "rayrollout.envkit.reset_step.gem:GemEnvironment"

GAME = "game:GuessTheNumber-v0-easy"  # 1 to 10, four guesses
LONG = {"env_id": "game:GuessTheNumber-v0-hard", "env_kwargs": {"max_turns": 12}}  # 1 to 50


def row(task_id, seed, replies, env_id=GAME, **fields):
    system = f"Guess the number; put it in \\boxed{{}}. [[replies={json.dumps(replies)}]]"
    return {
        "task_id": task_id,
        "prompt": [{"role": "system", "content": system}],
        "env_id": env_id,
        "seed": seed,
        **fields,
    }


ROWS = [
    row("found", 3, ["\\boxed{11}", "\\boxed{5}", "\\boxed{4}"]),  # seed 3 hides a 4
    row("no-guess", 3, ["I would rather not."]),  # GEM's format error: -0.1, game over
    row("out-of-guesses", 8, ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "\\boxed{10}"]),
    # Out of range every time: the game goes on to its own 12 turns.
    row("long", 5, ["\\boxed{99}"], env_id=LONG["env_id"], environment="gem_long"),
]


def by_hand(task):
    """GEM's own loop over the same actions: make, reset(seed), step until it ends."""
    replies = json.loads(task["prompt"][0]["content"].split("[[replies=", 1)[1][:-2])
    kwargs = LONG["env_kwargs"] if task.get("environment") == "gem_long" else {}
    env = gem.make(task["env_id"], **kwargs)
    env.reset(seed=task["seed"])
    rewards = []
    for turn in range(50):  # the game ends itself
        _, reward, terminated, truncated, _ = env.step(replies[min(turn, len(replies) - 1)])
        rewards.append(float(reward))
        if terminated or truncated:
            break
    return rewards


@pytest.fixture(scope="module")
def gem_run(tmp_path_factory, serve_session):
    base = tmp_path_factory.mktemp("gem")
    config = {
        "namespace": "gem-tests",
        "ray": {"serve_port": serve_session},
        "environments": {"gem_long": {"path": SOURCE, "args": {"env_kwargs": LONG["env_kwargs"]}}},
    }
    out = collect_rows(base, ROWS, config, "--env", "gem", "-n", "2")  # no --agent
    found: dict[str, list] = {}
    for trajectory in read_trajectories(out):
        found.setdefault(trajectory.task_id, []).append(trajectory)
    return found


@pytest.mark.parametrize("task", ROWS, ids=[r["task_id"] for r in ROWS])
def test_rewards_equal_gems_own_for_the_same_seed_and_actions(gem_run, task):
    expected = by_hand(task)
    samples = gem_run[task["task_id"]]
    assert len(samples) == 2  # a GRPO group: both samples play the row's seeded game
    for trajectory in samples:
        assert trajectory.status == "ok", trajectory.error
        assert [t.step_reward for t in trajectory.turns] == expected
        assert trajectory.reward == math.fsum(expected)
        assert trajectory.verification["env_id"] == task["env_id"]


def test_the_games_end_as_gem_ends_them(gem_run):
    found = gem_run["found"][0]
    assert found.reward == 1.0 and found.verification["terminated"]
    assert "Congratulations" in found.verification["final_observation"][0]
    assert gem_run["no-guess"][0].reward == pytest.approx(-0.1)
    out = gem_run["out-of-guesses"][0].verification
    assert out["truncated"] and out["steps"] == 4
    # The first observation is GEM's instructions, after the row's system prompt.
    assert "You are playing Guess The Number" in found.messages[1].content


def test_rows_naming_no_agent_are_played_by_reset_step(gem_run):
    assert {t.played_by for samples in gem_run.values() for t in samples} == {"reset_step"}


def test_a_game_plays_to_its_own_turn_limit_past_the_runs_default(gem_run):
    for trajectory in gem_run["long"]:
        assert trajectory.status == "ok", trajectory.error
        assert trajectory.verification["truncated"] and trajectory.verification["steps"] == 12
        assert len(trajectory.turns) == 12 > 8  # 8: the run's episode.max_turns by default
