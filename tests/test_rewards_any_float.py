"""Rewards are any finite float, end to end: -1 and 3 through a real collect, the summary,
``show``, the report, every export and ``generate``'s GRPO groups; NaN and infinity refused
with an error that says so, wherever a reward comes from (a verifier, a NeMo Gym server).

The run: ``ScheduledRewardEnv`` (``fixture_envs``) gives each task's samples the rewards its
row lists, in turn, on one agent; the scripted policy plays.
"""

import json

import pytest
import ray
from exports import invoke, load, read_lines
from fastapi import FastAPI, Request
from netutil import ServedApp
from rich.console import Console
from test_report import chromium, needs_chromium

from rayrollout import RolloutEngine, read_trajectories
from rayrollout.cli.progress import reward_text, summary_table
from rayrollout.cli.report import render_report
from rayrollout.data.config import EnvironmentConfig
from rayrollout.data.schema import Message, Task, Trajectory, Turn
from rayrollout.engine.groups import Group
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import EnvStats
from rayrollout.envkit import Episode, Verification
from rayrollout.envkit.nemo_gym.client import NemoGymConnections, NemoGymError

SCHEDULES = {"swing": [-1.0, 3.0], "steady": [3.0]}  # 2 samples each: -1 and 3; 3 and 3


def scheduled(task_id):
    return {
        "task_id": task_id,
        "prompt": f"note {task_id}",
        "environment": "scheduled",
        "rewards": SCHEDULES[task_id],
        "expected_answer": "any",
    }


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory, serve_session):
    """A collect (2 samples a task), then ``generate`` with dynamic sampling on the same
    engine. Returns (output folder, collect's summary, generate's result)."""
    base = tmp_path_factory.mktemp("rewards")
    tasks = base / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(scheduled(t)) + "\n" for t in SCHEDULES))
    config = {
        "namespace": "reward-tests",
        "environments": {"scheduled": {"path": "fixture_envs:ScheduledRewardEnv"}},
        "workers": {"num_workers": 1},  # the schedule is counted in one process
        "output": {"dir": str(base / "out")},
        "ray": {"serve_port": serve_session},
        "num_repeats": 2,
    }
    engine = RolloutEngine(config)
    try:
        collected = engine.collect(tasks)
        tasks_again = [scheduled(t) for t in SCHEDULES]
        generated = ray.get(engine.engine.generate.remote(tasks_again, 2, dynamic_sampling=True))
    finally:
        engine.shutdown()
    return base / "out", collected.summary, generated


def rows_of(out):
    return list(read_trajectories(out))


def test_collect_keeps_negative_and_above_one_rewards_as_given(reward_run):
    out, summary, _ = reward_run
    rewards = sorted(t.reward for t in rows_of(out))
    assert rewards == [-1.0, 3.0, 3.0, 3.0]
    assert summary.total.mean_reward == 2.0
    table = Console(width=80, record=True)
    table.print(summary_table(summary))
    text = table.export_text()
    assert "2.000" in text and max(len(line) for line in text.splitlines()) <= 80


def test_show_prints_the_negative_reward(reward_run):
    out, _, _ = reward_run
    (low,) = [t for t in rows_of(out) if t.reward < 0]
    code, output = invoke("show", out, "--task-id", "swing", "--sample", low.sample_index)
    assert code == 0, output
    assert "-1.000" in output
    code, listing = invoke("show", out, "--max-reward", "0")
    assert code == 0 and "-1.000" in listing and "3.000" not in listing


def test_the_report_gives_the_rewards_range_and_its_pass_threshold(reward_run):
    out, _, _ = reward_run
    page = render_report(out)
    assert 'data-figure="mean_reward" data-value="2.0"' in page
    assert 'data-figure="reward_range" data-value="4.0"' in page
    assert "-1 to 3" in page
    assert 'data-figure="pass_rate" data-value="0.75"' in page  # 3 of 4 at >= 1
    assert "pass rate (reward &gt;= 1)" in page
    assert page.count('<img class="plot"') >= 5  # every plot drew, none cut the rewards off


@needs_chromium
def test_the_report_of_negative_rewards_renders_in_chromium(reward_run, tmp_path):
    out, _, _ = reward_run
    page_path = tmp_path / "report.html"
    code, output = invoke("report", out, "--html", page_path)
    assert code == 0, output
    dom, stderr = chromium(tmp_path, page_path, "--dump-dom")
    assert 'data-figure="reward_range"' in dom and "-1 to 3" in dom, stderr[-2000:]
    assert [line for line in stderr.splitlines() if "CONSOLE" in line] == []


def test_exports_carry_the_rewards_and_take_thresholds_in_their_unit(reward_run, tmp_path):
    out, _, _ = reward_run
    code, output = invoke("export", "sft", out, tmp_path / "sft.jsonl", "--min-reward", "3")
    assert code == 0, output
    assert sorted(r["reward"] for r in load(tmp_path / "sft.jsonl")) == [3.0, 3.0, 3.0]
    code, output = invoke("export", "sft", out, tmp_path / "all.jsonl", "--min-reward", "-1")
    assert code == 0 and len(read_lines(tmp_path / "all.jsonl")) == 4
    code, output = invoke("export", "dpo", out, tmp_path / "dpo.parquet", "--min-gap", "4")
    assert code == 0, output
    (pair,) = load(tmp_path / "dpo.parquet")
    assert (pair["chosen_reward"], pair["rejected_reward"]) == (3.0, -1.0)
    code, output = invoke("export", "verl", out, tmp_path / "verl.jsonl")
    assert code == 0, output
    means = {
        r["extra_info"]["task_id"]: r["extra_info"]["mean_reward"]
        for r in read_lines(tmp_path / "verl.jsonl")
    }
    assert means == {"swing": 1.0, "steady": 3.0}
    code, output = invoke("export", "nemo-gym", out, tmp_path / "ng.jsonl")
    assert code == 0, output
    assert sorted(r["reward"] for r in read_lines(tmp_path / "ng.jsonl")) == [-1.0, 3.0, 3.0, 3.0]


def test_generate_groups_and_dynamic_sampling_take_negative_rewards(reward_run):
    _, _, result = reward_run
    (group,) = result.groups  # 'steady' scores 3 every time: no GRPO signal, dropped
    assert group.task_id == "swing"
    assert sorted(group.rewards) == [-1.0, 3.0]
    assert (group.reward_mean, group.reward_std) == (1.0, 2.0)
    by_reward = dict(zip(group.rewards, group.advantages(eps=0.0), strict=True))
    assert by_reward == {-1.0: -1.0, 3.0: 1.0}
    assert result.groups_dropped >= 1 and result.short_by == 1


def group_of(rewards):
    trajectories = [
        Trajectory(task_id="t", sample_index=i, group_id="t", environment="e", reward=r)
        for i, r in enumerate(rewards)
    ]
    return Group.of("t", trajectories)


def test_a_group_differs_by_more_than_float_noise_at_any_scale():
    assert not group_of([0.1 + 0.2, 0.3]).has_signal  # summed step rewards, one value
    assert not group_of([-100.0, -100.0]).has_signal
    assert group_of([100.0, 100.5]).has_signal
    assert group_of([-1e6, 1e6]).advantages(eps=0.0) == [-1.0, 1.0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_reward_that_is_not_finite_is_refused_saying_so(bad):
    with pytest.raises(ValueError, match="a reward must be a finite number"):
        Verification(reward=bad)
    with pytest.raises(ValueError, match="finite number"):
        Trajectory(task_id="t", sample_index=0, group_id="t", environment="e", reward=bad)
    with pytest.raises(ValueError, match="finite number"):
        Turn(step_reward=bad)


def test_any_finite_reward_is_a_verdict():
    for reward in (-100.0, -1.0, 0.0, 3.0, 1e9):
        assert Verification(reward=reward).reward == reward


def test_rewards_print_within_the_tables_width():
    assert [reward_text(r) for r in (-1.0, 3.0, -100.0)] == ["-1.000", "3.000", "-100.000"]
    assert reward_text(-123456.0) == "-1.235e+05"
    assert max(len(reward_text(r)) for r in (-1.2345e300, 1e300, -9999.9)) <= 11


class VerifyServer(ServedApp):
    """A NeMo Gym resources server whose /verify gives the reward the row names in ``give``
    (any JSON value), as generative_reward_model's -100 or multireward's 3."""

    def __init__(self) -> None:
        self.app = FastAPI()
        self.app.post("/seed_session")(self.seed_session)
        self.app.post("/verify")(self.verify)
        self.app.post("/close_session")(self.close_session)
        super().__init__(self.app)

    async def seed_session(self) -> dict:
        return {}

    async def verify(self, request: Request) -> dict:
        body = await request.json()
        return {**body, "reward": body["give"]}

    async def close_session(self) -> dict:
        return {}


async def nemo_gym_verdict(url, give):
    task = Task(
        task_id="t",
        environment="gym",
        prompt=[Message(role="user", content="hi")],
        fields={"give": give},
    )
    pool = NemoGymConnections()
    session = pool.session("gym", EnvironmentConfig(url=url, max_retries=0), task)
    try:
        await session.setup()
        answer = Message(role="assistant", content="done")
        return await session.verify(Episode(task=task, messages=[*task.prompt, answer]))
    finally:
        await session.close()
        await pool.close()


async def test_a_nemo_gym_servers_reward_stands_as_it_gave_it():
    with VerifyServer() as server:
        for give in (-100.0, -1, 3.0):
            assert (await nemo_gym_verdict(server.url, give)).reward == give
        with pytest.raises(NemoGymError, match="gave reward 'NaN', which is not a finite number"):
            await nemo_gym_verdict(server.url, "NaN")


def test_the_summary_table_keeps_80_columns_with_extreme_rewards():
    def stats(episodes, reward):
        return EnvStats(
            episodes=episodes,
            reward_sum=episodes * reward,
            statuses={"ok": episodes - 600, "error": 600},
            turns=3 * episodes,
            seconds_total=2.0 * episodes,
            seconds_sample=[0.5, 123.4],
        )

    snapshot = RunSnapshot(
        elapsed_s=1234.5,
        in_flight=0,
        episodes_per_s=8.1,
        total=stats(20000, -1.2345e300),
        by_env={"math_with_judge_long": stats(10000, -1.2345e300), "weather": stats(10000, -123.0)},
    )
    console = Console(width=80, record=True)
    console.print(summary_table(snapshot))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "-1.234e+300" in text and "-123.000" in text
