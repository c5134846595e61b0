"""What every adapter's output must be, checked against the row the service streamed and the
token policy's own ids (``token_policy``), independently of ``rayrollout.integrations``.

The policy's ids of a conversation are its messages' ids end to end, so the whole sequence a
trainer gets (prompt ids + response ids) must be the ids of the row's messages; the mask must
be 1 exactly on the assistant messages' ids (every model turn) and 0 on the tool results;
the logprobs must be the policy's on the mask and 0 elsewhere; each turn's recorded ids must
appear unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from token_policy import logprob, message_ids

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def trainer_python(name: str) -> Path:
    """The trainer venv's interpreter; the test is skipped with the command if it is missing."""
    python = ROOT / f".venv-trainers-{name}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} is missing: .ci/trainers builds it")
    return python


def trainer_env() -> dict[str, str]:
    """The environment for a trainer venv's process: without the PYTHONPATH the test session
    sets (it holds tests/, whose vllm folder a trainer would take for vLLM)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run_driver(trainer: str, script: str, *args: str | Path, out: Path, timeout: int = 540) -> Any:
    """Run ``script`` (a driver beside this module) with ``args`` in the ``trainer`` venv, in
    ``out``'s folder; the JSON record it wrote to ``out``. Its stderr's end names a failure."""
    python = trainer_python(trainer)
    done = subprocess.run(
        [str(python), str(HERE / script), *map(str, args)],
        capture_output=True,
        env=trainer_env(),
        cwd=out.parent,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def expected(row: dict[str, Any]) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt ids, response ids, mask, logprobs) the row must become."""
    messages = row["messages"]
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = [t for m in messages[:first] for t in message_ids(m)]
    response: list[int] = []
    mask: list[int] = []
    for message in messages[first:]:
        ids = message_ids(message)
        response += ids
        mask += [1 if message["role"] == "assistant" else 0] * len(ids)
    logprobs = [logprob(t) if m else 0.0 for t, m in zip(response, mask, strict=True)]
    return prompt, response, mask, logprobs


def check_versions(row: dict[str, Any], mask: list[int], versions: list[int]) -> list[str]:
    """The mismatches of an adapter's per-token versions (aligned with the response): on
    the mask, the row's policy turns' ``token_versions`` end to end, -1 elsewhere."""
    key = (row["task_id"], row["sample_index"])
    made: list[int] = []
    for turn in row["turns"]:
        if turn.get("speaker", "policy") == "policy":
            own = turn.get("token_versions") or []
            made += own or [turn["policy_version"]] * len(turn["completion_token_ids"])
    made.reverse()
    want = [made.pop() if m else -1 for m in mask] if len(made) == sum(mask) else None
    if want is None or versions != want:
        return [f"{key}: token versions"]
    return []


def check(
    row: dict[str, Any],
    prompt: list[int],
    response: list[int],
    mask: list[int],
    logprobs: list[float],
) -> list[str]:
    """The mismatches of one sample (empty: it is exactly the row)."""
    want_prompt, want_response, want_mask, want_logprobs = expected(row)
    problems = []
    key = (row["task_id"], row["sample_index"])
    if prompt != want_prompt:
        problems.append(f"{key}: prompt ids")
    if response != want_response:
        problems.append(f"{key}: response ids")
    if mask != want_mask:
        problems.append(f"{key}: mask")
    if [round(x, 6) for x in logprobs] != [round(x, 6) for x in want_logprobs]:
        problems.append(f"{key}: logprobs")
    sequence = prompt + response
    for index, turn in enumerate(row["turns"]):
        ids = turn["prompt_token_ids"] + turn["completion_token_ids"]
        if sequence[: len(ids)] != ids:
            problems.append(f"{key}: turn {index}'s ids are not a prefix of the sequence")
    return problems
