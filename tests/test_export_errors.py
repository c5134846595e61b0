"""Every way an export's input or arguments can be wrong: exit 2, an error naming it, no file."""

import json

from exports import invoke, math_trajectory, write_parts


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
        ("bad gap", ["dpo", zero, "out.jsonl", "--min-gap", "0"], "--min-gap must be a positive"),
        ("nan floor", ["sft", zero, "out.jsonl", "--min-reward", "nan"], "must be a finite"),
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
