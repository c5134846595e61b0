"""NeMo Gym 0.7.0's row shapes read as tasks (tests/test_tasks.py: our own format, limits)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_tasks import NEMO_GYM_ROW
from trajectories import unplayed

from rayrollout.data.responses import seed_body
from rayrollout.data.schema import Trajectory, trajectory_arrow_schema
from rayrollout.data.tasks import UNSUPPORTED, InvalidTaskError, parse_task_row, read_tasks

# Every row shape of NeMo Gym 0.7.0's datasets, in small rows written here (the nemo_gym tier
# reads the real ones from the wheel).

TOOL_HISTORY_ROW = {
    "responses_create_params": {
        "input": [
            {"role": "system", "content": "Answer from the search results."},
            {"role": "user", "content": "When was the Amiga sold?", "type": "message"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "."}]},
            {"type": "function_call", "name": "search", "call_id": "c1", "arguments": '{"q": 1}'},
            {"type": "function_call", "name": "search", "call_id": "c2", "arguments": '{"q": 2}'},
            {"type": "function_call_output", "call_id": "c1", "output": "in 1999"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"text": "no hit"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}],
            },
            {"type": "function_call", "name": "search", "id": "c3", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c3", "output": "1999-12-31"},
        ],
    },
    "verifier": {"citations": ["c1"]},
}


def refusal(row, **kwargs) -> InvalidTaskError:
    with pytest.raises(InvalidTaskError) as caught:
        parse_task_row(row, default_environment="gym", **kwargs)
    return caught.value


def test_tool_calls_and_outputs_in_input_become_chat_messages():
    task = parse_task_row(TOOL_HISTORY_ROW, default_environment="gym")
    assert [m.role for m in task.prompt] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    calls = task.prompt[2].tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("c1", "search", '{"q": 1}'),
        ("c2", "search", '{"q": 2}'),
    ]  # consecutive calls are one assistant turn; the reasoning item is left out
    assert [(m.tool_call_id, m.content) for m in task.prompt[3:5]] == [
        ("c1", "in 1999"),
        ("c2", "no hit"),
    ]
    assert task.prompt[5].content == "Let me check."  # the call after it joins its text
    assert [c.id for c in task.prompt[5].tool_calls] == ["c3"]  # a call id may be its 'id'
    assert task.fields == TOOL_HISTORY_ROW  # the reasoning item still goes back to NeMo Gym


@pytest.mark.parametrize(
    ("item", "field", "message"),
    [
        (
            {"type": "function_call_output", "call_id": "c9", "output": "x"},
            "responses_create_params.input[1].call_id",
            "answers no earlier function_call",
        ),
        (
            {"type": "function_call", "call_id": "c1", "arguments": "{}"},
            "responses_create_params.input[1].name",
            "missing",
        ),
        (
            {"type": "function_call", "name": "f", "call_id": "c1", "arguments": {"a": 1}},
            "responses_create_params.input[1].arguments",
            "JSON text",
        ),
        (
            {"type": "function_call", "name": "f", "arguments": "{}"},
            "responses_create_params.input[1].call_id",
            "must be a string",
        ),
        (
            {"type": "item_reference", "id": "msg_1"},
            "responses_create_params.input[1].type",
            "unsupported item type 'item_reference'",
        ),
        ({"role": "tool", "content": "x"}, "responses_create_params.input[1].role", "tool"),
        (
            {"role": "user", "content": [{"type": "input_text"}]},
            "responses_create_params.input[1].content[0]",
            "must be a text part",
        ),
    ],
)
def test_a_bad_item_in_input_is_named_by_index(item, field, message):
    row = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}, item]}}
    error = refusal(row)
    assert error.field == field
    assert message in error.message


def test_a_system_prompt_with_no_user_message_is_a_prompt():
    # NeMo Gym's Gymnasium and simulated-user tasks: the user turn comes from the environment.
    row = {"responses_create_params": {"input": [{"role": "system", "content": "Play."}]}}
    task = parse_task_row(row, default_environment="gym")
    assert [(m.role, m.content) for m in task.prompt] == [("system", "Play.")]
    own = parse_task_row(
        {"prompt": [{"role": "system", "content": "Play."}]}, default_environment="e"
    )
    assert own.prompt == task.prompt


def test_a_prompt_with_no_system_or_user_text_is_refused():
    row = {"responses_create_params": {"input": [{"role": "assistant", "content": "Hello."}]}}
    error = refusal(row)
    assert error.field == "responses_create_params.input"
    assert "no system or user message with text" in error.message


def test_instructions_lead_the_system_message_as_nemo_gym_renders_them():
    row = {
        "responses_create_params": {
            "instructions": "Use the tools.",
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "q"},
            ],
        }
    }
    task = parse_task_row(row, default_environment="gym")
    assert [(m.role, m.content) for m in task.prompt] == [
        ("system", "Use the tools.\n\nBe brief."),
        ("user", "q"),
    ]
    text_input = {"responses_create_params": {"instructions": "Sys.", "input": "q"}}
    task = parse_task_row(text_input, default_environment="gym")
    assert [(m.role, m.content) for m in task.prompt] == [("system", "Sys."), ("user", "q")]
    only_instructions = {"responses_create_params": {"instructions": "Sys.", "input": []}}
    task = parse_task_row(only_instructions, default_environment="gym")
    assert [(m.role, m.content) for m in task.prompt] == [("system", "Sys.")]


def test_an_environment_object_is_a_verifier_field_not_our_environment():
    world = {"patients": {"P1": {"name": "Emma"}}}
    row = {**NEMO_GYM_ROW, "environment": world}
    task = parse_task_row(row, default_environment="weather")
    assert task.environment == "weather"
    assert task.fields["environment"] == world
    with pytest.raises(InvalidTaskError, match="field 'environment': missing"):
        parse_task_row(row)  # with no --env, the row names no environment of ours


def test_a_nemo_gym_row_keeps_every_key_in_fields_and_goes_back_whole():
    row = {**NEMO_GYM_ROW, "task_id": 7, "environment": "weather", "prompt": "not ours here"}
    task = parse_task_row(row, default_environment="other")
    assert (task.task_id, task.environment) == ("7", "weather")
    assert task.fields == row  # task_id, environment and prompt included, verbatim
    assert task.fields["task_id"] == 7
    assert seed_body(task) == row  # /seed_session gets the row as NeMo Gym's agents send it
    # rayrollout's own rows keep only the verifier fields, as before.
    own = parse_task_row({"prompt": "hi", "task_id": "a", "environment": "e", "x": 1})
    assert own.fields == {"x": 1}


def test_task_fields_round_trip_through_parquet(tmp_path):
    row = {**TOOL_HISTORY_ROW, "task_id": 3, "environment": {"db": [1, 2.5, None, True]}}
    task = parse_task_row(row, default_environment="gym")
    trajectory = unplayed(task)
    table = pa.Table.from_pylist([trajectory.to_row()], schema=trajectory_arrow_schema())
    pq.write_table(table, tmp_path / "out.parquet")
    [back] = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert Trajectory.from_row(back).task_fields == row


def test_nemo_gym_rows_read_from_parquet_with_nulls_for_missing_item_keys(tmp_path):
    # Arrow gives every item the union of the items' keys, null where an item had none.
    items = [
        {"role": "user", "content": "When was the Amiga sold?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "."}]},
        {"type": "function_call", "name": "search", "call_id": "c1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "in 1999"},
    ]
    rows = [{"responses_create_params": {"input": items}, "task_id": f"t{i}"} for i in range(2)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tasks.parquet")
    tasks = list(read_tasks(tmp_path / "tasks.parquet", default_environment="gym"))
    assert [m.role for m in tasks[0].prompt] == ["user", "assistant", "tool"]
    assert tasks[0].prompt == tasks[1].prompt
    assert [t.task_id for t in tasks] == ["t0", "t1"]


def test_resolved_row_is_read_as_the_row_with_its_task_id():
    inner = {"responses_create_params": {"input": "hi"}, "persona": {"age": 35}}
    task = parse_task_row({"task_id": "u-1", "resolved_row": inner}, default_environment="gym")
    assert task.task_id == "u-1"
    assert task.fields == {**inner, "task_id": "u-1"}
    error = refusal({"task_id": "u-1", "resolved_row": {**inner, "task_id": "u-2"}})
    assert error.field == "resolved_row.task_id" and "differs" in error.message
    assert refusal({"resolved_row": ["x"]}).field == "resolved_row"


def test_a_usersim_row_without_a_prompt_is_the_nemo_gym_agents_to_open():
    row = {"task_id": "u-1", "resolved_row": {"persona": {}, "probe_type": "open"}}
    task = parse_task_row(row, default_environment="gym")
    # NeMo Gym's nemo_user_sim environment server opens it: the row goes to it whole.
    assert (task.task_id, task.opening, task.agent, task.prompt) == ("u-1", "agent", "nemo_gym", [])
    assert task.fields == row
    # The same task input, materialized (how NeMo Gym's environment server receives it).
    materialized = {"task_id": {"taskset": "usersim", "task_id": "u-1"}, "task_input": row}
    task = parse_task_row(materialized, default_environment="gym")
    assert (task.task_id, task.opening, task.agent) == ("usersim/u-1", "agent", "nemo_gym")
    assert task.fields == materialized
    assert refusal({"task_id": "u-1", "resolved_row": ["x"]}).field == "resolved_row"


def test_a_materialized_task_is_read_from_its_task_input():
    row = {
        "task_id": {"taskset": "math:train", "task_id": "0"},
        "task_input": {
            "responses_create_params": {"input": "2+2?"},
            "task_data": {"expected_answer": "4", "level": 1},
            "level": 1,
        },
    }
    task = parse_task_row(row, default_environment="math")
    assert task.task_id == "math:train/0"
    assert task.fields == {
        "responses_create_params": {"input": "2+2?"},
        "expected_answer": "4",
        "level": 1,
    }  # the flat row NeMo Gym's /verify body is built from
    conflict = json.loads(json.dumps(row))
    conflict["task_input"]["level"] = 2
    error = refusal(conflict)
    assert error.field == "task_input.level" and "task_data" in error.message
    error = refusal({"task_id": {"taskset": ""}, "task_input": {}})
    assert error.field == "task_id.taskset"
    error = refusal({"task_id": {"taskset": "a", "task_id": "b"}, "task_input": {"x": 1}})
    assert error.field == "task_input" and "no prompt" in error.message


def test_an_empty_input_is_opened_by_nemo_gyms_agent_which_plays_it():
    row = {
        "responses_create_params": {"input": [], "temperature": 1.0},
        "instance_id": "case-7",
        "agent_ref": {"type": "responses_api_agents", "name": "legal_agent_bench_harbor_agent"},
    }
    task = parse_task_row(row, default_environment="gym")
    # Its agent harness writes the prompt from the row's fields: the nemo_gym agent hands
    # the row whole to that agent server's /run.
    assert (task.opening, task.agent, task.prompt) == ("agent", "nemo_gym", [])
    assert task.fields == row and seed_body(task) == row
    # instructions alone are a prompt: the tool loop's, as before.
    row["responses_create_params"]["instructions"] = "Be brief."
    task = parse_task_row(row, default_environment="gym")
    assert (task.opening, task.agent) == ("prompt", None)
    # A prompt the row does give is still required to hold text.
    error = refusal({"responses_create_params": {"input": [{"role": "user", "content": " "}]}})
    assert error.field == "responses_create_params.input"


def test_an_empty_input_with_a_seed_request_is_opened_by_the_server():
    row = {
        "responses_create_params": {"input": []},
        "task_idx": 0,
        "agent_ref": {"type": "responses_api_agents", "name": "gsm8k_aviary_agent"},
    }
    task = parse_task_row(row, default_environment="aviary")
    assert task.opening == "seed_session" and task.prompt == [] and task.fields == row
    # instructions lead what the server opens with, as NeMo Gym's harnesses send them
    row["responses_create_params"]["instructions"] = "Be brief."
    task = parse_task_row(row, default_environment="aviary")
    assert [(m.role, m.content) for m in task.prompt] == [("system", "Be brief.")]


@pytest.mark.parametrize(
    ("part", "feature"),
    [
        ({"type": "input_file", "file_id": "f1"}, "file input"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA"}}, "audio input"),
    ],
)
def test_media_content_is_refused_not_dropped(part, feature):
    content = [{"type": "input_text", "text": "Where is the red circle?"}, part]
    row = {"responses_create_params": {"input": [{"role": "user", "content": content}]}}
    error = refusal(row)
    assert error.field == "responses_create_params.input[0].content[1]"
    assert error.message.startswith(f"{UNSUPPORTED}: {feature}.")


def test_image_content_is_kept_as_an_image_part():
    content = [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "high"},
        {"type": "input_text", "text": "Where is the red circle?"},
    ]
    row = {"responses_create_params": {"input": [{"role": "user", "content": content}]}}
    task = parse_task_row(row, default_environment="nemo_gym")
    (message,) = task.prompt
    assert message.content == "Where is the red circle?"
    assert [(p.type, p.url, p.detail) for p in message.parts] == [
        ("image", "data:image/png;base64,AAAA", "high"),
        ("text", None, None),
    ]
    assert task.fields == row  # the row itself is sent back to the resources server


def test_an_image_given_by_file_id_is_refused_naming_the_part():
    content = [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "file_id": "f"},
    ]
    row = {"responses_create_params": {"input": [{"role": "user", "content": content}]}}
    error = refusal(row)
    assert error.field == "responses_create_params.input[0].content[1]"
    assert "file_id" in error.message


def test_audio_in_metadata_is_refused():
    params = {"input": "Transcribe the audio.", "metadata": {"audio_data": "data:audio/wav;..."}}
    error = refusal({"responses_create_params": params})
    assert error.field == "responses_create_params.metadata.audio_data"
    assert error.message.startswith(f"{UNSUPPORTED}: audio input.")


@pytest.mark.parametrize(
    ("extra", "agent"),
    [
        (
            {"agent_ref": {"type": "responses_api_agents", "name": "blackjack_gymnasium_agent"}},
            "reset_step",
        ),
        ({"agent_ref": {"name": "gymnasium_agent"}}, "reset_step"),
        ({"agent_ref": {"name": "math_with_code_simple_agent"}}, "tool_loop"),
        ({"agent_ref": {"name": "legal_agent_bench_harbor_agent"}}, None),
        ({"agent_ref": "blackjack_gymnasium_agent"}, None),  # not NeMo Gym's {type, name}
        ({}, None),
    ],
)
def test_a_nemo_gym_rows_agent_ref_names_the_agent_that_plays_it_by_url(extra, agent):
    from rayrollout.agentkit.registry import resolve_agent
    from rayrollout.envkit.nemo_gym.client import RemoteEnvironment

    row = {"responses_create_params": {"input": "Deal me in."}, **extra}
    task = parse_task_row(row, default_environment="blackjack")
    assert RemoteEnvironment.agent_for(task) == agent
    # The environment's default fills the gap only: the run's --agent and the row's own win.
    assert resolve_agent(task, None, RemoteEnvironment) == (agent or "tool_loop")
    assert resolve_agent(task, "context_budget", RemoteEnvironment) == "context_budget"


def test_rows_opened_by_their_server_or_by_nemo_gyms_agent_name_the_agent_that_can():
    from rayrollout.agentkit.registry import resolve_agent
    from rayrollout.envkit.nemo_gym.client import RemoteEnvironment

    seeded = parse_task_row(
        {"responses_create_params": {"input": []}, "task_idx": 3}, default_environment="aviary"
    )
    assert resolve_agent(seeded, None, RemoteEnvironment) == "reset_step"
    written = parse_task_row(
        {"responses_create_params": {"input": []}, "problem_id": "10"}, default_environment="sc"
    )
    # The row names its agent itself: no other agent could write its prompt.
    assert resolve_agent(written, "tool_loop", RemoteEnvironment) == "nemo_gym"


async def test_a_usersim_row_is_refused_by_the_nemo_gym_agent_before_anything_is_sent():
    from types import SimpleNamespace

    from rayrollout.agentkit import EpisodeEnd
    from rayrollout.agents.nemo_gym import NemoGymAgent

    row = {"task_id": "u-1", "resolved_row": {"persona": {}, "probe_type": "open"}}
    task = parse_task_row(row, default_environment="gym")
    agent = NemoGymAgent(url="http://127.0.0.1:9", gateway_port=18199)
    with pytest.raises(EpisodeEnd) as ended:
        await agent.play(SimpleNamespace(task=task))  # type: ignore[arg-type]
    assert ended.value.status == "error"
    assert str(ended.value.error).startswith(f"{UNSUPPORTED}: NeMo UserSim's episode protocol.")
