"""``export verl``: one prompt row per task, as verl's RL trainer reads it (pandas/pyarrow),
and where a trajectory's prompt ends and its episode begins (``split_prompt``)."""

import json

import pyarrow.parquet as pq
import pytest
from exports import invoke, load, math_trajectory, write_parts

from rayrollout.data.export import ExportError, export_run, split_prompt


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
