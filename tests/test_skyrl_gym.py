"""skyrl-gym's own environments through ``collect`` with no flags beyond the environment's
name (the ``skyrl_gym`` source, played by its default agent ``reset_step``, within each
environment's own turn limit): gsm8k_multi_turn, and text2sql on a small SQLite file in
Spider's layout made here. Each row's rewards must equal skyrl-gym's own when its environment is
stepped by hand with the same actions, negative ones included.

The scripted policy plays the model: each row's system prompt carries
``[[replies=[...]]]``, the k-th reply its k-th action (the last one again past the end).
"""

import json
import math
import sqlite3

import pytest
from cli_run import collect_rows

skyrl_gym = pytest.importorskip(
    "skyrl_gym", reason="skyrl-gym is not installed: pip install 'rayrollout[skyrl-gym]'"
)
from omegaconf import OmegaConf  # noqa: E402 (skyrl-gym's dependency: after its skip)

from rayrollout import read_trajectories  # noqa: E402


def row(task_id, question, replies, **fields):
    system = f"Answer. [[replies={json.dumps(replies)}]]"
    return {
        "task_id": task_id,
        "prompt": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        **fields,
    }


def gsm8k(task_id, replies, answer="72", max_turns=3):
    question = "Natalia sold clips to 48 friends in April and half as many in May. How many?"
    return row(
        task_id,
        question,
        replies,
        env_class="gsm8k_multi_turn",
        reward_spec={"method": "rule", "ground_truth": answer},
        extra_info={"max_turns": max_turns},
    )


def text2sql(task_id, replies):
    return row(
        task_id,
        "Names of singers older than 30?",
        replies,
        env_class="text2sql",
        db_id="concert",
        data="spider",
        reward_spec={"method": "rule", "ground_truth": "SELECT name FROM singer WHERE age > 30"},
    )


ROWS = [
    # Right at the third try: 0.2/3 per well-formed wrong answer, then 1: above 1 summed.
    gsm8k("gsm8k-third", ["I think #### 70", "#### 71", "#### 72"]),
    gsm8k("gsm8k-never", ["no idea"], max_turns=2),
    # Its own limit of 10 turns, past the run's default of 8: played to the end.
    gsm8k("gsm8k-long", ["#### 1"], max_turns=10),
    # A query, then the answer in the format text2sql scores: 1.
    text2sql(
        "sql-right",
        [
            "<think>look first</think><sql>SELECT name, age FROM singer</sql>",
            "<think>two of them</think><solution>SELECT name FROM singer WHERE age > 30</solution>",
        ],
    ),
    # No <think>: text2sql's format rule gives -1.
    text2sql("sql-unformatted", ["<solution>SELECT name FROM singer</solution>"]),
]


def spider_database(root):
    """``<root>/spider/database/concert/concert.sqlite``, the layout text2sql reads."""
    folder = root / "spider" / "database" / "concert"
    folder.mkdir(parents=True)
    with sqlite3.connect(folder / "concert.sqlite") as db:
        db.execute("CREATE TABLE singer (name TEXT, age INTEGER)")
        db.executemany("INSERT INTO singer VALUES (?, ?)", [("Ann", 25), ("Bo", 41), ("Cy", 33)])
    return root


def by_hand(task, env_config):
    """skyrl-gym's own loop over the same actions: make, init, step until done."""
    replies = json.loads(task["prompt"][0]["content"].split("[[replies=", 1)[1][:-2])
    extras = {k: v for k, v in task.items() if k not in ("task_id", "prompt", "env_class")}
    env = skyrl_gym.make(task["env_class"], env_config=OmegaConf.create(env_config), extras=extras)
    env.init(task["prompt"])
    rewards = []
    for turn in range(50):  # the environment ends itself
        answer = env.step(replies[min(turn, len(replies) - 1)])
        rewards.append(float(answer["reward"]))
        if answer["done"]:
            break
    env.close()
    return rewards


@pytest.fixture(scope="module")
def skyrl_run(tmp_path_factory, serve_session):
    base = tmp_path_factory.mktemp("skyrl")
    env_config = {"db_path": str(spider_database(base / "sql_data"))}
    config = {
        "namespace": "skyrl-tests",
        "ray": {"serve_port": serve_session},
        "environments": {"skyrl_gym": {"args": {"env_config": env_config}}},
    }
    out = collect_rows(base, ROWS, config, "--env", "skyrl_gym")  # no --agent
    return {t.task_id: t for t in read_trajectories(out)}, env_config


@pytest.mark.parametrize("task", ROWS, ids=[r["task_id"] for r in ROWS])
def test_rewards_equal_skyrl_gyms_own_for_the_same_actions(skyrl_run, task):
    rows, env_config = skyrl_run
    trajectory = rows[task["task_id"]]
    expected = by_hand(task, env_config)
    assert trajectory.status == "ok", trajectory.error
    assert [t.step_reward for t in trajectory.turns] == expected
    assert trajectory.reward == math.fsum(expected)
    assert trajectory.verification["source"] == "skyrl-gym"
    assert trajectory.verification["env_id"] == task["env_class"]


def test_rows_naming_no_agent_play_with_reset_step_to_the_environments_own_limit(skyrl_run):
    rows, _ = skyrl_run
    assert {t.played_by for t in rows.values()} == {"reset_step"}
    long = rows["gsm8k-long"]
    assert long.status == "ok" and long.verification["terminated"]
    assert long.verification["steps"] == len(long.turns) == 10 > 8  # 8: the run's default


def test_the_rewards_cover_negative_and_above_one(skyrl_run):
    rows, _ = skyrl_run
    assert rows["sql-unformatted"].reward == -1.0
    assert rows["sql-right"].reward == 1.0
    assert rows["gsm8k-third"].reward > 1.0
    assert rows["gsm8k-never"].reward == 0.0


def test_text2sql_shows_the_query_result_as_the_next_user_turn(skyrl_run):
    rows, _ = skyrl_run
    messages = rows["sql-right"].messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert "Bo" in messages[3].content and "41" in messages[3].content
