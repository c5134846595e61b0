"""Exports of a run's output as training data, checked the way their readers read them.

SFT and DPO files load with Hugging Face ``datasets`` and have the columns and message shapes
TRL's trainers take (TRL itself pulls in torch, so its two checks used here are mirrored
below, with their source); NeMo Gym rows validate against the OpenAI ``Response`` model that
NeMo Gym's ``NeMoGymResponse`` extends, under the field names of its ``BaseVerifyResponse``.
"""

import json
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
import yaml
from jinja2.sandbox import ImmutableSandboxedEnvironment
from openai.types.responses import Response
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from rayrollout.deployments.vllm.tiny_model import CHAT_TEMPLATE
from typer.testing import CliRunner

from rayrollout.cli.commands import app
from rayrollout.data.export import ExportError, export_run, split_prompt
from rayrollout.data.schema import EpisodeMetrics, FunctionCall, Message, ToolCall, Trajectory
from rayrollout.data.writer import PartWriter, make_sink

ROOT = Path(__file__).resolve().parents[1]
NEMO_GYM_TASKS = ROOT / "environments" / "weather" / "tasks_nemo_gym.jsonl"
MATH_TASKS = ROOT / "environments" / "math" / "tasks.jsonl"
runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def load(path):
    """The file as TRL's users load it (the cache beside it, not in the home folder)."""
    kind = "parquet" if path.suffix == ".parquet" else "json"
    cache = str(path.parent / ".hf-cache")
    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache)


def is_conversational(example):
    """``trl.data_utils.is_conversational`` (TRL 1.16): a supported key holding role messages."""
    keys = [k for k in ("prompt", "chosen", "rejected", "completion", "messages") if k in example]
    return bool(keys) and all(
        isinstance(example[k], list) and isinstance(example[k][0], dict) and "role" in example[k][0]
        for k in keys
    )


def render(messages, tools, add_generation_prompt=False):
    """What ``tokenizer.apply_chat_template(..., tokenize=False)`` renders with the tiny model's
    ChatML template (Qwen2.5 tool style), in a sandbox as transformers runs it."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = env.from_string(CHAT_TEMPLATE)
    return template.render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
    )


def write_parts(directory, trajectories, fmt="jsonl", rows_per_part=3):
    sink = make_sink(directory, fmt, "r")
    sink.start()
    writer = PartWriter(sink, rows_per_part, 60)
    for table in writer.add([t.to_row() for t in trajectories]) + writer.drain():
        writer.write(table)
    sink.complete()
    return directory


CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def math_trajectory(task_id, sample_index, reward, answer, status="ok", few_shot=False):
    """A two-turn calculator episode as the engine writes it (one assistant message a turn)."""
    prompt = [Message(role="system", content="Answer in one line.")]
    if few_shot:
        prompt += [
            Message(role="user", content="What is 1 + 1?"),
            Message(role="assistant", content="2"),
        ]
    prompt.append(Message(role="user", content=f"What is 6 * 7? ({task_id})"))
    call = ToolCall(
        id=f"call_{sample_index}",
        function=FunctionCall(name="calculator", arguments='{"expression": "6 * 7"}'),
    )
    return Trajectory(
        task_id=task_id,
        sample_index=sample_index,
        group_id=task_id,
        environment="math",
        model="scripted",
        reward=reward,
        status=status,
        tools=[CALCULATOR],
        messages=[
            *prompt,
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id=call.id, name="calculator", content="42"),
            Message(role="assistant", content=f"The answer is {answer}."),
        ],
        metrics=EpisodeMetrics(turns=2, tool_calls=1, tokens_in=30, tokens_out=12),
        task_fields={"expected_answer": "42"},
        verification={"predicted": answer},
    )


def real_task_lines():
    """Two NeMo Gym weather rows (with their agent_ref) and two rayrollout math rows."""
    return NEMO_GYM_TASKS.read_text().splitlines()[:2] + MATH_TASKS.read_text().splitlines()[:2]


def collect_run(base, lines, serve_port, **config):
    """A real ``rayrollout collect`` of these task rows, 2 samples each, scripted policy on
    Serve; ``config`` adds to the run's config file (e.g. ``policy``). Returns the folder."""
    tasks = base / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    path = base / "run.yaml"
    path.write_text(
        yaml.safe_dump({"namespace": "export-tests", "ray": {"serve_port": serve_port}, **config})
    )
    out = base / "run"
    args = ["--env", "weather", "--policy", "scripted", "-n", "2", "--out", out, "--config", path]
    code, output = invoke("collect", tasks, *args)
    assert code == 0, output
    return out


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, serve_session):
    """A real collect: NeMo Gym weather rows and math rows, 2 samples each, scripted policy."""
    return collect_run(tmp_path_factory.mktemp("export-run"), real_task_lines(), serve_session)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_sft_rows_of_a_real_run_load_as_trl_conversational_data(real_run, tmp_path, suffix):
    out = tmp_path / f"sft{suffix}"
    code, output = invoke("export", "sft", real_run, out)
    assert code == 0, output
    assert f"wrote 8 sft row(s) to {out}" in " ".join(output.split())
    rows = load(out)
    assert {"messages", "tools"} <= set(rows.column_names)
    assert len(rows) == 8
    for row in rows:
        assert is_conversational(row)
        roles = [m["role"] for m in row["messages"]]
        assert roles[-3:] == ["assistant", "tool", "assistant"] and "user" in roles
        call = row["messages"][-3]["tool_calls"][0]["function"]
        assert isinstance(call["arguments"], dict)  # objects, as chat templates take them
        tool_message = row["messages"][-2]
        assert set(tool_message) == {"role", "content", "tool_call_id", "name"}  # no null keys
        tools = json.loads(row["tools"])  # TRL's trainers json.loads a string 'tools' column
        assert tools[0]["type"] == "function" and tools[0]["function"]["name"] == call["name"]
        text = render(row["messages"], tools)
        arguments = json.dumps(call["arguments"], ensure_ascii=False)
        expected = f'{{"name": "{call["name"]}", "arguments": {arguments}}}'
        assert expected in text
        assert text.endswith(row["messages"][-1]["content"] + "<|im_end|>\n")
    assert sorted(rows["reward"]) == [1.0] * 8


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


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


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


def test_verl_rows_of_a_real_run_hold_one_prompt_per_task(real_run, tmp_path):
    out = tmp_path / "verl.parquet"
    code, output = invoke("export", "verl", real_run, out)
    assert code == 0, output
    rows = load(out)
    assert rows.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(rows) == 4
    by_source = {}
    for row in rows:
        by_source.setdefault(row["data_source"], []).append(row)
        assert row["prompt"][-1]["role"] == "user" and row["prompt"][-1]["content"]
        assert row["reward_model"]["style"] == "rule"
        assert row["extra_info"]["samples"] == 2 and row["extra_info"]["mean_reward"] == 1.0
    assert sorted(by_source) == ["math", "weather"]
    # One row per task in the order tasks first appear in the run's parts, which is the
    # order episodes finished: compare as a set.
    math_answers = [r["reward_model"]["ground_truth"] for r in by_source["math"]]
    assert sorted(math_answers) == ["1024", "84"]
    assert sorted(r["extra_info"]["index"] for r in rows) == [0, 1, 2, 3]
    # verl reads it with pandas/pyarrow too: plain Arrow types, no extension types.
    assert pq.read_table(out).schema.field("prompt").type.value_type.num_fields == 2


def group_run(directory):
    """Three tasks: a (rewards 1, 0, .5), b (.6, .4: gap too small), c (best sample failed)."""
    return write_parts(
        directory,
        [
            math_trajectory("a", 0, 0.5, "41"),
            math_trajectory("b", 0, 0.6, "42"),
            math_trajectory("a", 1, 0.0, "40"),
            math_trajectory("c", 0, 0.0, "7"),
            math_trajectory("b", 1, 0.4, "41"),
            math_trajectory("c", 1, 1.0, "42", status="error"),
            math_trajectory("a", 2, 1.0, "42"),  # third part: its pair half arrives last
        ],
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_dpo_pairs_each_tasks_best_and_worst_sample_by_the_reward_gap(tmp_path, suffix):
    out = tmp_path / f"pairs{suffix}"
    summary = export_run("dpo", group_run(tmp_path / "run"), out, min_gap=0.5)
    assert (summary.rows_read, summary.tasks, summary.rows_written) == (7, 3, 1)
    rows = load(out)
    assert {"prompt", "chosen", "rejected", "tools"} <= set(rows.column_names)
    row = rows[0]
    assert is_conversational(row)
    assert (row["task_id"], row["chosen_sample_index"], row["rejected_sample_index"]) == ("a", 2, 1)
    assert (row["chosen_reward"], row["rejected_reward"]) == (1.0, 0.0)
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    for side in ("chosen", "rejected"):
        assert [m["role"] for m in row[side]] == ["assistant", "tool", "assistant"]
    assert row["chosen"][-1]["content"] == "The answer is 42."
    assert row["rejected"][-1]["content"] == "The answer is 40."
    # As TRL's apply_chat_template does: the prompt (with the generation prompt) is a prefix
    # of prompt + chosen, and the completion is what follows it.
    tools = json.loads(row["tools"])
    prompt = render(row["prompt"], tools, add_generation_prompt=True)
    full = render(row["prompt"] + row["chosen"], tools)
    assert full.startswith(prompt)
    assert full[len(prompt) :].startswith("<tool_call>\n")
    assert "The answer is 42." in full[len(prompt) :]


def test_smaller_gap_pairs_more_tasks_and_failed_samples_never_pair(tmp_path):
    out = tmp_path / "pairs.jsonl"
    export_run("dpo", group_run(tmp_path / "run"), out, min_gap=0.2)
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    picked = [(p["task_id"], p["chosen_sample_index"], p["rejected_sample_index"]) for p in pairs]
    # b: 0.6 - 0.4 is 0.19999999999999996, taken at a 0.2 gap; c's best sample failed.
    assert sorted(picked) == [("a", 2, 1), ("b", 0, 1)]


def test_few_shot_assistant_messages_stay_in_the_prompt(tmp_path):
    trajectory = math_trajectory("f", 0, 1.0, "42", few_shot=True)
    prompt, episode = split_prompt(trajectory)
    assert [m.role for m in prompt] == ["system", "user", "assistant", "user"]
    assert [m.role for m in episode] == ["assistant", "tool", "assistant"]
    # Read back without the turns column (exports skip it), the count in metrics decides.
    run = write_parts(tmp_path / "run", [trajectory], fmt="parquet")
    export_run("verl", run, tmp_path / "verl.jsonl")
    row = json.loads((tmp_path / "verl.jsonl").read_text())
    assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "user"]
    trajectory.metrics.turns = 5
    with pytest.raises(ExportError, match=r"field 'metrics.turns': 5 model calls"):
        split_prompt(trajectory)


def bad_inputs(tmp_path):
    """(name, args, expected error text) for each way the input can be wrong."""
    empty = tmp_path / "empty"
    empty.mkdir()
    no_rows = tmp_path / "no-rows"
    no_rows.mkdir()
    (no_rows / "part-r-00000.jsonl").write_text("")
    broken = write_parts(tmp_path / "broken", [math_trajectory("a", 0, 1.0, "42")])
    part = next(broken.glob("part-*.jsonl"))
    part.write_text(part.read_text() + '{"task_id": "a", \n')
    bad_reward = tmp_path / "bad-reward"
    bad_reward.mkdir()
    row = math_trajectory("a", 0, 1.0, "42").to_row()
    row.update(reward="high", created_at=str(row["created_at"]))
    (bad_reward / "part-r-00000.jsonl").write_text(json.dumps(row) + "\n")
    zero = write_parts(tmp_path / "zero", [math_trajectory("a", 0, 0.0, "1")])
    all_failed = write_parts(
        tmp_path / "all-failed", [math_trajectory("a", i, 0.0, "1", status="error") for i in (0, 1)]
    )
    twice = write_parts(tmp_path / "twice", [math_trajectory("a", 0, 1.0, "42")] * 2)
    return [
        ("missing folder", ["sft", tmp_path / "nope"], "input folder not found"),
        ("no part files", ["sft", empty], "no part files (part-*.parquet or part-*.jsonl)"),
        ("no rows", ["verl", no_rows], "hold no rows"),
        ("unknown format", ["kto", zero], "unknown export 'kto'; use one of sft, dpo"),
        ("bad suffix", ["sft", zero, "out.csv"], "OUT must end in .jsonl or .parquet"),
        ("nemo-gym parquet", ["nemo-gym", zero, "out.parquet"], "name OUT 'out.jsonl'"),
        ("malformed line", ["sft", broken], "part-r-00000.jsonl line 2: malformed JSON"),
        ("bad field", ["dpo", bad_reward], "line 1, field 'reward': not a number: 'high'"),
        ("nothing passes", ["sft", zero], "reward >= 1.0; lower --min-reward"),
        ("no pair", ["dpo", zero], "has two 'ok' samples whose rewards differ by >= 0.5"),
        ("bad gap", ["dpo", zero, "out.jsonl", "--min-gap", "0"], "--min-gap must be in (0, 1]"),
        ("nemo-gym none verified", ["nemo-gym", all_failed], "was verified (status ok, max_turns"),
        ("nemo-gym all failed", ["nemo-gym", all_failed], "truncated); 2 failed"),
        ("nemo-gym twice", ["nemo-gym", twice], "line 2: task 'a' sample 0 is already in"),
    ]


def test_bad_input_exits_2_with_an_error_naming_it_and_writes_nothing(tmp_path):
    outputs = tmp_path / "outputs"
    for name, args, expected in bad_inputs(tmp_path):
        kind, source, *rest = args
        out = outputs / (rest[0] if rest else "out.jsonl")
        code, output = invoke("export", kind, source, out, *rest[1:])
        assert code == 2, (name, output)
        assert expected in " ".join(output.split()), (name, output)
    # No file, no temporary: nemo-gym's failures and inputs files neither.
    assert not outputs.exists() or not any(outputs.iterdir())
