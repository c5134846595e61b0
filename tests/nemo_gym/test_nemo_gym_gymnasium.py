"""NeMo Gym 0.7.0's Gymnasium-style servers through ``collect --env-url``, and against its own
``gymnasium_agent``.

blackjack is NeMo Gym's own server (``GymnasiumServer``: ``/reset`` deals a hand, ``/step``
reads ``<action>hit|stand</action>`` from the model's Responses answer; +1 win, 0 draw, -1
loss or bust; no ``/seed_session``), started by its own ``ng_run``. Its deals are random, so
each episode's reward is checked against the server's own account of the hand (its final
step's ``info``), not against a fixed number. The scripted policy plays the actions a row
scripts (``[[replies=...]]``), the ``reset_step`` agent steps them: the rows' ``agent_ref``
(``blackjack_gymnasium_agent``) picks it, with no ``--agent``.

example_multi_turn_gymnasium is deterministic (scripted follow-ups, 1 when the last answer
holds the expected text), so the same rows and scripted replies are also played by NeMo
Gym's own ``gymnasium_agent`` (with its ``openai_model`` on the scripted policy, collected
by ``ng_collect_rollouts``): the rewards and step counts must be the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli_run import collect_tasks
from ngrun import NemoGymRun, free_port, policy_model_block, resources_server_block
from served_policy import scripted_policy_on_serve

HIT, STAND = "<action>hit</action>", "<action>stand</action>"
SCRIPTS = [[STAND], [HIT, STAND], [HIT, HIT, STAND], [HIT]]  # the last one hits to a bust
REWARD_OF = {"win": 1.0, "draw": 0.0, "loss": -1.0, "bust": -1.0}


@pytest.fixture(scope="module")
def blackjack(ng_src: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    port = free_port()
    run = NemoGymRun(resources_server_block("blackjack", port), tmp_path_factory.mktemp("bj"))
    run.start()
    try:
        yield f"http://127.0.0.1:{port}", run
    finally:
        run.stop()


def _rows(ng_src: Path, path: Path) -> Path:
    """NeMo Gym's own blackjack row, once per script: the script in its system message."""
    example = ng_src / "resources_servers" / "blackjack" / "data" / "example.jsonl"
    row = json.loads(example.read_text().splitlines()[0])
    with path.open("w") as out:
        for script in SCRIPTS:
            copy = json.loads(json.dumps(row))
            system = copy["responses_create_params"]["input"][0]
            system["content"] += f" [[replies={json.dumps(script)}]]"
            out.write(json.dumps(copy) + "\n")
    return path


def _script(row: pd.Series) -> list[str]:
    """The actions a trajectory's row scripted (in its system message)."""
    system = json.loads(row["task_fields"])["responses_create_params"]["input"][0]["content"]
    (script,) = [s for s in SCRIPTS if f"[[replies={json.dumps(s)}]]" in system]
    return script


def _codes(run: NemoGymRun, route: str) -> list[str]:
    """Status codes of the access-log lines of ``POST /route`` on the blackjack server."""
    pattern = rf"\(blackjack[^)]*\) INFO:\s+\S+ - \"POST /{route} HTTP/1.1\" (\d+)"
    return re.findall(pattern, run.log())


def _collect(
    tmp_path: Path, tasks: Path, url: str, port: int, *flags: str, exit_code: int = 0
) -> pd.DataFrame:
    namespace = f"ng-bj-{tmp_path.name[-8:]}"
    config = {"namespace": namespace, "ray": {"serve_port": port}, "episode": {"max_turns": 20}}
    env = ["--env", "blackjack", "--env-url", f"blackjack={url}"]
    return pd.read_parquet(
        collect_tasks(tmp_path, tasks, config, *env, *flags, exit_code=exit_code)
    )


def test_nemo_gyms_own_blackjack_rows_play_with_no_agent_flag(
    blackjack: tuple, ng_src: Path, serve_session: int, tmp_path: Path
) -> None:
    # example.jsonl as NeMo Gym ships it: five copies of "Deal me in.", each naming
    # agent_ref blackjack_gymnasium_agent, which the reset_step agent plays.
    url, run = blackjack
    example = ng_src / "resources_servers" / "blackjack" / "data" / "example.jsonl"
    resets_before = len(_codes(run, "reset"))
    frame = _collect(tmp_path, example, url, serve_session)
    rows = [line for line in example.read_text().splitlines() if line.strip()]
    print(f"\nblackjack example.jsonl, no --agent: {frame['status'].value_counts().to_dict()}, "
          f"rewards {sorted(frame['reward'].tolist())}")  # fmt: skip
    assert len(frame) == len(rows) == 5 and frame["task_id"].nunique() == 5
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    assert (frame["played_by"] == "reset_step").all()
    assert set(frame["reward"]) <= {-1.0, 0.0, 1.0}
    for _, row in frame.iterrows():
        info = json.loads(row["verification"])["info"]
        assert row["reward"] == REWARD_OF[info["result"]], info
    assert len(_codes(run, "reset")) - resets_before == 5


def test_collect_plays_nemo_gyms_blackjack_by_reset_and_step(
    blackjack: tuple, ng_src: Path, serve_session: int, tmp_path: Path
) -> None:
    url, run = blackjack
    resets_before, steps_before = len(_codes(run, "reset")), len(_codes(run, "step"))
    frame = _collect(tmp_path, _rows(ng_src, tmp_path / "bj.jsonl"), url, serve_session)

    assert len(frame) == len(SCRIPTS)
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    assert (frame["played_by"] == "reset_step").all()  # the rows' agent_ref: no --agent
    assert frame["close_error"].isna().all(), frame["close_error"].tolist()
    steps_total = 0
    for _, row in frame.iterrows():
        verification = json.loads(row["verification"])
        script = _script(row)
        step_rewards = [t["step_reward"] for t in row["turns"] if t["step_reward"] is not None]
        # Each step's reward is on its turn; the episode's is their sum, the server's verdict.
        assert step_rewards == verification["step_rewards"]
        assert row["reward"] == pytest.approx(sum(step_rewards))
        assert verification["terminated"] is True  # the server ended the hand (and its state)
        info = verification["info"]
        assert row["reward"] == REWARD_OF[info["result"]], info
        # The scripted actions were the ones stepped: a hand not busted ended on the stand.
        if info["result"] != "bust":
            assert verification["steps"] == len(script), (script, verification)
        elif len(script) > 1:
            assert verification["steps"] <= len(script) - 1
        steps_total += verification["steps"]
    # The server's own access log: no /seed_session (that is how the kind was found), one
    # reset per episode and every step answered.
    assert _codes(run, "seed_session").count("404") >= len(SCRIPTS)
    assert _codes(run, "reset")[resets_before:] == ["200"] * len(SCRIPTS)
    assert _codes(run, "step")[steps_before:] == ["200"] * steps_total


def test_another_agent_on_a_gymnasium_server_fails_saying_which_agent_plays_it(
    blackjack: tuple, ng_src: Path, serve_session: int, tmp_path: Path
) -> None:
    url, _ = blackjack
    tasks = _rows(ng_src, tmp_path / "bj.jsonl")
    # The user's --agent wins over the rows' agent_ref; 3: every episode failed.
    frame = _collect(tmp_path, tasks, url, serve_session, "--agent", "tool_loop", exit_code=3)
    assert (frame["status"] == "error").all()
    for error in frame["error"]:
        assert "Gymnasium-style" in error and "reset_step" in error, error


def test_rows_naming_no_agent_on_a_gymnasium_server_play_with_reset_step_unless_chosen(
    blackjack: tuple, ng_src: Path, serve_session: int, tmp_path: Path
) -> None:
    # NeMo Gym's own blackjack rows without their agent_ref, as indian_banking's rows come:
    # the server's kind, read once from its routes before the run, picks reset_step.
    url, run = blackjack
    example = ng_src / "resources_servers" / "blackjack" / "data" / "example.jsonl"
    rows = [json.loads(line) for line in example.read_text().splitlines() if line.strip()]
    for row in rows:
        assert row.pop("agent_ref")["name"] == "blackjack_gymnasium_agent"
    tasks = tmp_path / "no_agent_ref.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    asked = len(_gets(run, "openapi.json"))
    (tmp_path / "auto").mkdir()
    frame = _collect(tmp_path / "auto", tasks, url, serve_session)
    assert len(frame) == len(rows) == 5
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    assert (frame["played_by"] == "reset_step").all()
    for _, row in frame.iterrows():
        info = json.loads(row["verification"])["info"]
        assert row["reward"] == REWARD_OF[info["result"]], info
    assert _gets(run, "openapi.json")[asked:] == ["200"]  # once per URL, before the run

    # The user's --agent still wins: the tool loop's calls are not Gymnasium's (3: all failed).
    (tmp_path / "chosen").mkdir()
    chosen = _collect(
        tmp_path / "chosen", tasks, url, serve_session, "--agent", "tool_loop", exit_code=3
    )
    assert (chosen["played_by"] == "tool_loop").all()
    assert (chosen["status"] == "error").all()


def _gets(run: NemoGymRun, route: str) -> list[str]:
    """Status codes of the access-log lines of ``GET /route`` on the blackjack server."""
    pattern = rf"\(blackjack[^)]*\) INFO:\s+\S+ - \"GET /{re.escape(route)} HTTP/1.1\" (\d+)"
    return re.findall(pattern, run.log())


MULTI_TURN = "example_multi_turn_gymnasium"


@pytest.fixture(scope="module")
def policy_url(serve_session: int) -> Iterator[str]:
    # NeMo Gym's openai_model sends its openai_api_key (below) as the bearer token.
    with scripted_policy_on_serve("ng-gym-policy", serve_session, "not-needed") as url:
        yield url


def _multi_turn_rows(ng_src: Path, path: Path) -> list[dict]:
    """NeMo Gym's own rows, each with scripted replies: the expected answer in every other."""
    example = ng_src / "resources_servers" / MULTI_TURN / "data" / "example.jsonl"
    rows = [json.loads(line) for line in example.read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        reply = f"It is {row['expected_answer']}." if i % 2 == 0 else "I cannot say."
        row["responses_create_params"]["input"][0]["content"] += (
            f" [[replies={json.dumps([reply])}]]"
        )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def test_the_same_rows_and_replies_score_as_nemo_gyms_own_gymnasium_agent(
    ng_src: Path, policy_url: str, serve_session: int, tmp_path: Path
) -> None:
    tasks = tmp_path / "multi_turn.jsonl"
    rows = _multi_turn_rows(ng_src, tasks)
    port = free_port()
    blocks = resources_server_block(MULTI_TURN, port)
    agent_config = yaml.safe_load(
        (ng_src / "resources_servers" / MULTI_TURN / "configs" / f"{MULTI_TURN}.yaml").read_text()
    )
    for name, block in agent_config.items():
        if name != MULTI_TURN:  # its gymnasium_agent and that agent's environment server
            blocks[name] = block
    blocks.update(policy_model_block(policy_url))
    run = NemoGymRun(blocks, tmp_path)
    output = tmp_path / "rollouts.jsonl"
    try:
        run.start()
        collected = run.collect_rollouts(f"{MULTI_TURN}_agent", tasks, output)
        assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
        # No --agent: the rows' agent_ref names a gymnasium_agent, which reset_step plays.
        ours = _collect(tmp_path, tasks, f"http://127.0.0.1:{port}", serve_session)
    finally:
        run.stop()
    theirs = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
    assert len(theirs) == len(ours) == len(rows)
    assert (ours["status"] == "ok").all(), ours["error"].tolist()

    def first_prompt(params: dict) -> str:
        return params["input"][0]["content"]

    their_reward = {first_prompt(r["responses_create_params"]): r["reward"] for r in theirs}
    their_steps = {
        first_prompt(r["responses_create_params"]): sum(
            1 for item in r["response"]["output"] if item.get("role") == "assistant"
        )
        for r in theirs
    }
    for _, row in ours.iterrows():
        key = first_prompt(json.loads(row["task_fields"])["responses_create_params"])
        verification = json.loads(row["verification"])
        assert row["reward"] == their_reward[key], (key, row["reward"], their_reward[key])
        assert verification["steps"] == their_steps[key], key
    expected = [1.0 if i % 2 == 0 else 0.0 for i in range(len(rows))]
    assert sorted(their_reward.values()) == sorted(expected)
