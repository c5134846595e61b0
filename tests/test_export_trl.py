"""``export sft`` and ``export dpo``, checked the way TRL's trainers read them.

The files load with Hugging Face ``datasets`` and have the columns and message shapes TRL's
trainers take; rendered with the tiny model's chat template, the DPO prompt is a prefix of
prompt + chosen, as TRL's ``apply_chat_template`` needs.
"""

import json

import pytest
from exports import invoke, is_conversational, load, math_trajectory, render, write_parts

from rayrollout.data.export import export_run


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
