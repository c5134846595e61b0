"""Forced tokens and the model's own logprobs (``rayrollout.policy.model_logprobs``).

The policy client against a server that answers in vLLM's shapes over real HTTP: a
constrained generation (forced tokens read 0.0) and the rescoring prefill's
``prompt_logprobs``. Then the row: Parquet and JSONL keep both fields, a part written before
they existed reads them as empty, and ``rayrollout show`` prints them. Real vLLM on a real
model: tests/vllm/test_model_logprobs_vllm.py.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from netutil import served_routes
from typer.testing import CliRunner

from rayrollout.cli import app
from rayrollout.data.config import PolicyConfig
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Message, Trajectory, Turn, trajectory_arrow_schema
from rayrollout.policy.call import PolicyRequest
from rayrollout.policy.client import PolicyClient, PolicyError

PROMPT = [1, 2, 3]
COMPLETION = [10, 11, 12, 13]
SAMPLED = [0.0, -0.75, 0.0, -0.25]  # under a constraint: 10 and 12 were forced
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]


def own_logprob(position: int) -> float:
    """The stub model's own logprob of the token at ``position`` of a rescored prompt."""
    return -0.25 * position


@pytest.fixture
async def vllm_shaped():
    """Chat Completions with token ids and logprobs, and ``/completions`` rescoring with
    ``prompt_logprobs``, in vLLM's shapes; keeps every request body."""
    state: dict[str, Any] = {"bodies": [], "headers": [], "short": False}

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        state["bodies"].append(body)
        message: dict[str, Any] = {"role": "assistant", "content": "42"}
        choice = {
            "index": 0,
            "finish_reason": "stop",
            "message": message,
            "token_ids": COMPLETION,
            "logprobs": {"content": [{"token": "x", "logprob": v} for v in SAMPLED]},
        }
        return web.json_response(
            {"choices": [choice], "prompt_token_ids": PROMPT, "usage": {"prompt_tokens": 3}}
        )

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        state["bodies"].append(body)
        state["headers"].append(request.headers.get("x-session-id"))
        ids = body["prompt"]
        entries: list[Any] = [None] + [
            {str(token): {"logprob": own_logprob(i), "rank": 1, "decoded_token": "x"}}
            for i, token in enumerate(ids)
            if i > 0
        ]
        if state["short"]:
            entries = entries[:-1]
        choice = {"index": 0, "text": "", "token_ids": [0], "prompt_logprobs": entries}
        return web.json_response({"choices": [choice]})

    routes = {"/v1/chat/completions": chat, "/v1/completions": completions}
    async with served_routes(routes) as base_url:
        yield base_url, state


async def one_turn(url: str, tools: list[dict[str, Any]], **config: Any) -> Turn:
    policy = PolicyClient(
        PolicyConfig(kind="openai", model="m", return_token_ids=True, **config), url
    )
    try:
        reply = await policy.complete(
            PolicyRequest(
                [Message(role="user", content="6 * 7?")], tools=tools, session_id="episode-1"
            )
        )
    finally:
        await policy.close()
    return reply.turn


async def test_a_constrained_turn_marks_its_forced_tokens_and_gets_the_models_own_logprobs(
    vllm_shaped,
):
    url, state = vllm_shaped
    turn = await one_turn(url, TOOLS, tool_choice="required")
    assert turn.logprobs == SAMPLED
    assert turn.forced == [True, False, True, False]
    # The model's own: the rescoring prefill's logprobs at the completion's positions.
    assert turn.model_logprobs == [own_logprob(i) for i in range(3, 7)]
    rescore = state["bodies"][1]
    assert rescore["prompt"] == PROMPT + COMPLETION
    assert rescore["prompt_logprobs"] == 0 and rescore["max_tokens"] == 1
    assert state["headers"] == ["episode-1"]  # the episode's replica, as its other calls


async def test_an_unconstrained_turn_copies_its_sampled_logprobs_and_sends_no_second_call(
    vllm_shaped,
):
    url, state = vllm_shaped
    turn = await one_turn(url, TOOLS, tool_choice="auto")
    assert turn.forced == [] and turn.model_logprobs == SAMPLED
    assert len(state["bodies"]) == 1


@pytest.mark.parametrize(
    ("setting", "config", "forced", "model_logprobs", "calls"),
    [
        ("off: forced still marked", {"tool_choice": "required", "model_logprobs": "off"},
         [True, False, True, False], [], 1),
        ("all: every turn rescored", {"tool_choice": "auto", "model_logprobs": "all"},
         [], [own_logprob(i) for i in range(3, 7)], 2),
        ("a response_format constrains too", {"extra_body": {"response_format": {"type":
         "json_object"}}}, [True, False, True, False], [own_logprob(i) for i in range(3, 7)], 2),
    ],
)  # fmt: skip
async def test_the_setting_and_the_request_decide_what_is_rescored(
    vllm_shaped, setting, config, forced, model_logprobs, calls
):
    url, state = vllm_shaped
    turn = await one_turn(url, TOOLS, **config)
    assert (turn.forced, turn.model_logprobs, len(state["bodies"])) == (
        forced,
        model_logprobs,
        calls,
    ), setting


async def test_a_rescoring_answer_short_of_a_logprob_is_a_policy_error_naming_it(vllm_shaped):
    url, state = vllm_shaped
    state["short"] = True
    with pytest.raises(PolicyError, match=r"6 prompt_logprobs for 7 tokens"):
        await one_turn(url, TOOLS, tool_choice="required", max_retries=0)


def constrained_trajectory(task_id: str = "t1") -> Trajectory:
    turn = Turn(
        prompt_token_ids=PROMPT,
        completion_token_ids=COMPLETION,
        logprobs=SAMPLED,
        forced=[True, False, True, False],
        model_logprobs=[-9.5, -0.75, -0.25, -0.5],
    )
    return Trajectory(
        task_id=task_id, sample_index=0, group_id=task_id, environment="math", turns=[turn]
    )


def test_parquet_and_jsonl_rows_keep_forced_tokens_and_the_models_own_logprobs(tmp_path):
    trajectory = constrained_trajectory()
    schema = trajectory_arrow_schema()
    turn_type = schema.field("turns").type.value_type
    assert turn_type.field("forced").type == pa.list_(pa.bool_())
    assert turn_type.field("model_logprobs").type == pa.list_(pa.float32())
    pq.write_table(pa.Table.from_pylist([trajectory.to_row()], schema=schema), tmp_path / "t.pq")
    assert Trajectory.from_row(pq.read_table(tmp_path / "t.pq").to_pylist()[0]) == trajectory
    line = json.dumps(trajectory.to_row(), default=str)
    assert Trajectory.from_row(json.loads(line)) == trajectory


def test_a_part_written_before_the_fields_existed_reads_them_as_empty(tmp_path):
    schema = trajectory_arrow_schema()
    turn_type = schema.field("turns").type.value_type
    old_turn = pa.struct([f for f in turn_type if f.name not in ("forced", "model_logprobs")])
    fields = [f.with_type(pa.list_(old_turn)) if f.name == "turns" else f for f in schema]
    row = constrained_trajectory("old").to_row()
    for turn in row["turns"]:
        del turn["forced"], turn["model_logprobs"]
    pq.write_table(
        pa.Table.from_pylist([row], schema=pa.schema(fields)), tmp_path / "part-a-00000.parquet"
    )
    [old] = RunFolder(tmp_path).trajectories()
    assert old.turns[0].forced == [] and old.turns[0].model_logprobs == []
    assert old.turns[0].logprobs == SAMPLED


def test_show_prints_each_turns_forced_tokens_and_the_gap_to_the_models_own(tmp_path):
    row = constrained_trajectory().to_row()
    pq.write_table(
        pa.Table.from_pylist([row], schema=trajectory_arrow_schema()),
        tmp_path / "part-a-00000.parquet",
    )
    result = CliRunner().invoke(app, ["show", str(tmp_path), "--task-id", "t1"], terminal_width=200)
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if "9.500" in line]
    # Turn 0: 2 of its 4 tokens forced; the largest gap is the first forced token's (0.0
    # sampled, -9.5 the model's own).
    assert [cell.strip() for cell in line.split("│")[1:5]] == ["0", "2", "4", "9.500"]
    assert "constrained calls" in result.output
