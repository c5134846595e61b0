"""The reset/step episode: the ``reset_step`` agent playing a reset/step environment through
``collect`` (``TallyEnv`` in ``step_envs``: no library needed), every ending and fault, the
per-step rewards in the row, and rows written before the field existed.

The scripted policy plays the model's part: each row's system prompt carries
``[[replies=[...]]]``, the replies it answers in turn.
"""

import importlib.util
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_run import collect_rows
from step_envs import TallyEnv
from typer.testing import CliRunner

from rayrollout import read_trajectories
from rayrollout.cli.commands import app
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Message, Task, Trajectory, Turn, trajectory_arrow_schema
from rayrollout.envkit import Episode
from rayrollout.envkit.reset_step import ResetStepError, reset_step_session
from rayrollout.envkit.sessions import InlineSession


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def row(task_id, replies, agent=None, **fields):
    """A row of the tally environment; no agent: its declared default, reset_step, plays it."""
    prompt = f"Score points. [[replies={json.dumps(replies)}]]"
    return {
        "task_id": task_id,
        "prompt": [{"role": "system", "content": prompt}],
        "environment": "tally",
        **({"agent": agent} if agent else {}),
        **fields,
    }


ROWS = [
    row("stop", ["-1", "3", "stop"]),
    row("limit", ["2.5"], limit=2),
    row("turns", ["1"], agent="reset_step"),  # named: the same agent
    row("boom", ["1", "boom"]),
    row("nan", ["nan"]),
    row("tool-loop", ["1"], agent="tool_loop"),
]


@pytest.fixture(scope="module")
def tally_run(tmp_path_factory, serve_session):
    """One collect of every row above; returns (output folder, trajectories by task id)."""
    base = tmp_path_factory.mktemp("reset-step")
    config = {
        "namespace": "reset-step-tests",
        "ray": {"serve_port": serve_session},
        "environments": {"tally": {"path": "step_envs:TallyEnv"}},
        "episode": {"max_turns": 4},
    }
    out = collect_rows(base, ROWS, config, "--policy", "scripted")
    return out, {t.task_id: t for t in read_trajectories(out)}


def test_each_step_reward_is_kept_on_its_turn_and_the_reward_is_their_sum(tally_run):
    _, rows = tally_run
    stop = rows["stop"]
    assert stop.status == "ok" and stop.played_by == "reset_step"
    assert [t.step_reward for t in stop.turns] == [-1.0, 3.0, 0.0]
    assert stop.reward == 2.0
    details = stop.verification
    assert details["step_rewards"] == [-1.0, 3.0, 0.0]
    assert (details["steps"], details["terminated"], details["truncated"]) == (3, True, False)
    assert details["final_observation"] == ["Step 3 scored 0.0."]  # never shown to the model
    # reset's first observation, then reply and observation in turn; no tools offered.
    roles = [m.role for m in stop.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert [m.content for m in stop.messages[2::2]] == ["-1", "3", "stop"]
    assert stop.messages[3].content == "Step 1 scored -1.0."
    assert stop.tools == [] and stop.metrics.tool_calls == 0
    # One token sequence: every call after the first extends the one before.
    assert [t.extends_previous for t in stop.turns] == [False, True, True]
    steps = [(e.kind, e.name) for e in stop.metrics.timeline if e.kind == "step"]
    assert steps == [("step", "reset")] + [("step", "step")] * 3


def test_the_environment_cutting_the_episode_short_is_recorded_as_truncated(tally_run):
    limit = tally_run[1]["limit"]
    assert limit.status == "ok" and limit.reward == 5.0  # above 1: summed as they are
    assert [t.step_reward for t in limit.turns] == [2.5, 2.5]
    assert limit.verification["truncated"] and not limit.verification["terminated"]


def test_running_out_of_turns_ends_max_turns_with_the_steps_so_far_summed(tally_run):
    turns = tally_run[1]["turns"]
    assert turns.status == "max_turns" and turns.reward == 4.0
    assert [t.step_reward for t in turns.turns] == [1.0] * 4


def test_an_environment_that_breaks_ends_its_episode_naming_it(tally_run):
    boom, nan = tally_run[1]["boom"], tally_run[1]["nan"]
    assert boom.status == "error"
    assert boom.error == "tally environment 'tally' failed in step 2: ValueError: the tally broke"
    assert [t.step_reward for t in boom.turns] == [1.0, None]  # the turn before the fault kept
    assert nan.status == "error"
    assert nan.error.startswith("tally environment 'tally' failed in step 1: its answer has")
    assert "unusable 'reward': Input should be a finite number" in nan.error


def test_rows_naming_no_agent_are_played_by_the_environments_default(tally_run):
    rows = tally_run[1]
    assert {rows[name].played_by for name in ("stop", "limit", "boom", "turns")} == {"reset_step"}


def test_a_row_naming_another_agent_wins_and_is_told_to_use_reset_step(tally_run):
    played = tally_run[1]["tool-loop"]
    assert played.played_by == "tool_loop"  # the row's own choice wins over the default
    assert played.status == "error"
    assert "is a reset/step environment and was never reset" in played.error
    assert "play it with the reset_step agent, its default" in played.error


def test_show_lists_each_step_reward(tally_run):
    out, _ = tally_run
    code, output = invoke("show", out, "--task-id", "stop")
    assert code == 0, output
    assert "environment steps" in output and "sum so far" in output
    assert "-1.000" in output and "3.000" in output and "2.000" in output
    assert "step reset" in output  # the timeline


def test_only_a_reset_step_environment_in_this_process_can_be_stepped():
    task = Task.model_validate(row("t", ["1"]))
    session = InlineSession(TallyEnv, task)
    assert reset_step_session(session) is session.env
    assert reset_step_session(object()) is None  # a Serve session: its instance is elsewhere


async def test_a_session_refuses_steps_out_of_order_and_closes_once():
    env = TallyEnv(Task.model_validate(row("t", ["1"])))
    await env.setup()
    with pytest.raises(ResetStepError, match="stepped before it was reset"):
        await env.step(Message(role="assistant", content="1"))
    opening = await env.reset([Message(role="system", content="go")])
    assert opening.messages[-1].content == "Say a number."
    await env.step(Message(role="assistant", content="stop"))
    with pytest.raises(ResetStepError, match="stepped after its episode ended"):
        await env.step(Message(role="assistant", content="1"))
    verdict = await env.verify(Episode(task=env.task, messages=opening.messages))
    assert verdict.reward == 0.0 and verdict.details["terminated"]
    await env.close()
    assert not env.made


def test_parts_written_before_step_rewards_existed_read_with_none(tmp_path):
    trajectory = Trajectory(
        task_id="old", sample_index=0, group_id="old", environment="e", reward=-1.0
    )
    trajectory.turns.append(Turn(completion_token_ids=[1]))
    schema = trajectory_arrow_schema()
    turn = schema.field("turns").type.value_type
    old_turn = pa.struct([f for f in turn if f.name != "step_reward"])
    old = schema.set(schema.get_field_index("turns"), pa.field("turns", pa.list_(old_turn)))
    row = trajectory.to_row()
    for t in row["turns"]:
        del t["step_reward"]
    pq.write_table(pa.Table.from_pylist([row], schema=old), tmp_path / "part-r-00000.parquet")
    (read,) = RunFolder(tmp_path).trajectories()
    assert read.reward == -1.0 and read.turns[0].step_reward is None


@pytest.mark.parametrize(
    ("name", "module", "extra"), [("gem", "gem", "gem"), ("skyrl_gym", "skyrl_gym", "skyrl-gym")]
)
def test_a_source_without_its_library_stops_collect_naming_the_extra(tmp_path, name, module, extra):
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here: the source can run")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "Guess.", "env_id": "x"}) + "\n")
    code, output = invoke("collect", tasks, "--env", name, "--out", tmp_path / "out")
    assert code == 2, output
    assert f"the '{module}' package" in output and f"pip install 'rayrollout[{extra}]'" in output
    assert not (tmp_path / "out").exists()


def test_env_list_shows_the_reset_step_sources():
    code, output = invoke("env", "list")
    assert code == 0, output
    assert "skyrl_gym" in output and "gem" in output


def test_the_scripted_policy_answers_the_replies_a_prompt_scripts_in_turn():
    from rayrollout.deployments.scripted.strategy import next_action

    replies = ["\\boxed{5}", "<sql>SELECT ']]'</sql>"]
    messages = [{"role": "system", "content": f"Play. [[replies={json.dumps(replies)}]]"}]
    assert next_action(messages, []).text == "\\boxed{5}"
    messages += [{"role": "assistant", "content": "\\boxed{5}"}, {"role": "user", "content": "no"}]
    assert next_action(messages, []).text == "<sql>SELECT ']]'</sql>"
    messages += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "again"}]
    assert next_action(messages, []).text == "<sql>SELECT ']]'</sql>"  # the last one again
    broken = [{"role": "user", "content": "What is the weather like in Oslo? [[replies=[1]]]"}]
    assert next_action(broken, []).text.startswith("I have no tools")  # not strings: ignored
