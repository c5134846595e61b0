"""A verifiers environment (a classic ``ToolEnv``, tests/verifiers_envs.py) through ``collect``
with the ``verifiers`` agent: its own rollout against the episode's recording gateway.

Every model call the rollout made must be a recorded policy turn (as many as verifiers' own
trajectory counts; token ids, which the scripted policy has none of, are the vLLM tier's),
and the reward must equal the rubric's own score when the rubric is called by hand on the
recorded messages. Runs in verifiers' own venv (.ci/verifiers): verifiers brings 22 packages
and holds websockets below the 17.x that .venv's openenv extra installs.
"""

import asyncio
import json

import pytest
from cli_run import collect_rows

vf = pytest.importorskip("verifiers", reason="verifiers is not installed: see .ci/verifiers")

from rayrollout import read_trajectories  # noqa: E402
from rayrollout.envkit.verifiers import load_verifiers_environment  # noqa: E402

CALL = {"tool": "multiply", "arguments": {"a": 6, "b": 7}}


def row(task_id, replies, **fields):
    prompt = f"What is 6 times 7? Use the tool. [[replies={json.dumps(replies)}]]"
    return {
        "task_id": task_id,
        "prompt": [{"role": "user", "content": prompt}],
        "vf_env": "verifiers_envs",
        "answer": "42",
        **fields,
    }


ROWS = [
    row("one-call", [CALL, "6 times 7 is 42."]),
    row("two-calls", [CALL, CALL, "It is 42."]),
    row("wrong", ["It is 41."]),
    row("bad-env", ["It is 42."], vf_env="no_such_verifiers_env"),
    row("vf-cuts-it", [CALL]),  # calls for ever: verifiers' own max_turns (4) ends it
    row("out-of-turns", [CALL], vf_env_args={"max_turns": 20}),  # rayrollout's (6) ends it
]


@pytest.fixture(scope="module")
def vf_run(tmp_path_factory, serve_session):
    base = tmp_path_factory.mktemp("verifiers")
    config = {
        "namespace": "verifiers-tests",
        "ray": {"serve_port": serve_session},
        "episode": {"max_turns": 6},
    }
    out = collect_rows(base, ROWS, config, "--env", "verifiers", "--agent", "verifiers")
    return {t.task_id: t for t in read_trajectories(out)}


def rubric_by_hand(trajectory):
    """The environment's rubric called on the recorded messages (prompt, then completion)."""
    env = load_verifiers_environment("verifiers_envs", {})
    messages = [m.to_openai() for m in trajectory.messages]
    state = {
        "prompt": messages[:1],
        "completion": messages[1:],
        "answer": "42",
        "info": {},
        "trajectory": [],
    }
    asyncio.run(env.rubric.score_rollout(state))
    return state["reward"]


@pytest.mark.parametrize(
    ("task_id", "calls"), [("one-call", 2), ("two-calls", 3), ("wrong", 1), ("vf-cuts-it", 4)]
)
def test_every_model_call_is_a_recorded_turn_and_the_reward_is_the_rubrics(vf_run, task_id, calls):
    trajectory = vf_run[task_id]
    assert (trajectory.status, trajectory.error) == ("ok", None)
    assert trajectory.played_by == "verifiers"
    assert trajectory.verification["model_calls"] == calls  # verifiers' own count
    assert len(trajectory.turns) == calls
    assert [t.speaker for t in trajectory.turns] == ["policy"] * calls
    # Each call sent the transcript so far (prompt, then a reply and its tool result per
    # call): one token sequence, each turn extending the one before.
    assert [t.prompt_message_count for t in trajectory.turns] == [1, 3, 5, 7][:calls]
    assert [t.extends_previous for t in trajectory.turns] == [False] + [True] * (calls - 1)
    assistants = [m for m in trajectory.messages if m.role == "assistant"]
    assert len(assistants) == calls
    assert trajectory.reward == rubric_by_hand(trajectory)


def test_rewards_leave_zero_to_one_as_the_rubric_says(vf_run):
    assert vf_run["one-call"].reward == 1.5  # 2.0 for 42, -0.5 for the call
    assert vf_run["two-calls"].reward == 1.0
    assert vf_run["wrong"].reward == 0.0
    metrics = vf_run["one-call"].verification["metrics"]
    assert (metrics["right_product"], metrics["tool_calls"]) == (2.0, 1.0)


def test_an_environment_that_does_not_load_is_an_error_row(vf_run):
    trajectory = vf_run["bad-env"]
    assert trajectory.status == "error"
    assert "'no_such_verifiers_env' did not load" in trajectory.error
    assert trajectory.turns == []


def test_verifiers_own_turn_limit_is_an_ok_episode_marked_truncated(vf_run):
    trajectory = vf_run["vf-cuts-it"]
    assert trajectory.verification["stop_condition"] == "max_turns_reached"
    assert trajectory.reward == -2.0  # four calls, no answer


def test_out_of_rayrollouts_turns_the_rubric_still_scores_the_transcript(vf_run):
    trajectory = vf_run["out-of-turns"]
    assert (trajectory.status, len(trajectory.turns)) == ("max_turns", 6)
    assert trajectory.reward == rubric_by_hand(trajectory) == -3.0
