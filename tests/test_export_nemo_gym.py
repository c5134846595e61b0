"""``export nemo-gym``, checked the way NeMo Gym reads its rollouts.

Rows validate against the OpenAI ``Response`` model that NeMo Gym's ``NeMoGymResponse``
extends, under the field names of its ``BaseVerifyResponse``; failed episodes go to the
failures file and every episode has its row in the materialized inputs file beside it.
"""

import json

from exports import NEMO_GYM_TASKS, invoke, math_trajectory, read_lines, write_parts
from openai.types.responses import Response
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from rayrollout.data.export import export_run


class GymRollout(BaseModel):
    """NeMo Gym's ``BaseVerifyResponse`` (nemo_gym/base_resources_server.py) plus the keys its
    ``rollout_collection.py`` stamps on each line; extra verifier fields are allowed. (The
    ``nemo_gym`` tier checks the same files with NeMo Gym's own models and tools.)"""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    responses_create_params: dict
    response: Response
    reward: float
    task_index: int = Field(alias="_ng_task_index")
    rollout_index: int = Field(alias="_ng_rollout_index")
    environment_server: str = Field(alias="_ng_environment_server")
    result_type: str = Field(alias="_ng_result_type")


def test_nemo_gym_rows_of_a_real_run_revalidate_as_nemo_gym_rollouts(real_run, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    code, output = invoke("export", "nemo-gym", real_run, out)
    assert code == 0, output
    assert f"wrote 8 nemo-gym row(s) to {out}" in " ".join(output.split())
    lines = read_lines(out)
    assert len(lines) == 8
    originals = [json.loads(line) for line in NEMO_GYM_TASKS.read_text().splitlines()[:2]]
    params_adapter = TypeAdapter(ResponseCreateParamsNonStreaming)
    for line in lines:
        rollout = GymRollout.model_validate(line)
        params_adapter.validate_python(rollout.responses_create_params)
        assert [item.type for item in rollout.response.output] == [
            "function_call",
            "function_call_output",
            "message",
        ]
        assert rollout.response.output[0].call_id == rollout.response.output[1].call_id
        assert rollout.response.output[2].content[0].text
        assert rollout.reward == 1.0
        # A float in the file itself, as NeMo Gym's dumped responses hold it (not an int).
        assert isinstance(line["response"]["created_at"], float)
        assert rollout.result_type == "legacy_agent"
        if line.get("agent_ref"):  # a NeMo Gym row: its own request comes back unchanged
            assert line["responses_create_params"] in [
                o["responses_create_params"] for o in originals
            ]
            assert line["agent_ref"] == originals[0]["agent_ref"]
            assert rollout.environment_server == "weather"
        else:  # a rayrollout row: the request is built from its prompt and tools
            assert line["expected_answer"] and line["responses_create_params"]["tools"]
            assert rollout.environment_server == "math"
    keys = {(line["_ng_task_index"], line["_ng_rollout_index"]) for line in lines}
    assert keys == {(task, sample) for task in range(4) for sample in range(2)}
    assert sum(1 for line in lines if line.get("agent_ref")) == 4
    # Beside it, as NeMo Gym's collection leaves them: no failures (the file is still there),
    # and one input row per rollout, under the same keys and with the same request.
    assert (tmp_path / "rollouts_failures.jsonl").read_text() == ""
    inputs = read_lines(tmp_path / "rollouts_materialized_inputs.jsonl")
    by_key = {(i["_ng_task_index"], i["_ng_rollout_index"]): i for i in inputs}
    assert len(by_key) == len(inputs) == 8
    for line in lines:
        given = by_key[(line["_ng_task_index"], line["_ng_rollout_index"])]
        assert given["responses_create_params"] == line["responses_create_params"]
        assert given.get("agent_ref") == line.get("agent_ref")
        assert given["task_id"] == line["task_id"]
        assert "response" not in given and "reward" not in given
        assert "_ng_result_type" not in given  # a result's stamp, not an input's


def failing_run(directory):
    """Task a: a verified sample and an error; b: a timeout only; c: truncated (verified)."""
    crashed = math_trajectory("a", 1, 0.0, "41", status="error")
    crashed.error = "tool 'calculator' failed: RuntimeError: boom"
    slow = math_trajectory("b", 0, 0.0, "42", status="timeout")
    slow.error = "policy call timed out after 1.0 s"
    return write_parts(
        directory,
        [
            math_trajectory("a", 0, 1.0, "42"),
            crashed,
            slow,
            math_trajectory("c", 0, 0.0, "4", status="truncated"),
        ],
    )


def test_failed_episodes_go_to_the_failures_file_without_a_reward(tmp_path):
    out = tmp_path / "out" / "rollouts.jsonl"
    code, output = invoke("export", "nemo-gym", failing_run(tmp_path / "run"), out)
    assert code == 0, output
    assert "wrote 2 nemo-gym row(s)" in output
    summary = export_run("nemo-gym", tmp_path / "run", out)  # again, through the API
    assert (summary.rows_read, summary.tasks) == (4, 3)
    assert (summary.rows_written, summary.failures_written) == (2, 2)
    failures_path = out.with_name("rollouts_failures.jsonl")
    inputs_path = out.with_name("rollouts_materialized_inputs.jsonl")
    assert summary.files == [out, failures_path, inputs_path]
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(p.name for p in summary.files)

    rollouts = {(r["task_id"], r["_ng_rollout_index"]): r for r in read_lines(out)}
    assert sorted(rollouts) == [("a", 0), ("c", 0)]
    assert rollouts[("c", 0)]["response"]["status"] == "incomplete"
    failures = {(r["task_id"], r["_ng_rollout_index"]): r for r in read_lines(failures_path)}
    assert sorted(failures) == [("a", 1), ("b", 0)]
    crashed, slow = failures[("a", 1)], failures[("b", 0)]
    assert crashed["_ng_failure_class"] == "agent_run_error"
    assert crashed["_ng_failure_message"] == "tool 'calculator' failed: RuntimeError: boom"
    assert slow["_ng_failure_class"] == "agent_timeout"
    assert slow["_ng_failure_message"] == "policy call timed out after 1.0 s"
    for row in failures.values():
        assert "reward" not in row and "response" not in row  # not a verifier's zero
        partial = Response.model_validate(row["_ng_failure_partial_response"])
        assert partial.status == "failed" and partial.output[0].type == "function_call"
        assert (row["_ng_environment_server"], row["_ng_result_type"]) == ("math", "legacy_agent")
    # One task numbering across the three files; every episode has its input row.
    assert crashed["_ng_task_index"] == rollouts[("a", 0)]["_ng_task_index"] == 0
    assert (slow["_ng_task_index"], rollouts[("c", 0)]["_ng_task_index"]) == (1, 2)
    inputs = read_lines(inputs_path)
    assert sorted((i["task_id"], i["_ng_rollout_index"]) for i in inputs) == sorted(
        [*rollouts, *failures]
    )
