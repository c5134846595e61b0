"""A trainer without Ray, as ``test_service_client_vllm.py`` runs it: on another Python, in
a venv holding only the light client (``pip install ./clients/python``).

It starts nothing. It submits TASKS tasks x N samples to the rollout service, reads every
trajectory from the stream, pauses, pushes a checkpoint by path, resumes, submits a few
more tasks and reads them, then prints what it saw as one JSON object (the test asserts on
it). Only the standard library and ``rayrollout.client`` are imported.

Usage: python http_trainer.py URL TOKEN_FILE TASKS N CHECKPOINT
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections import Counter
from typing import Any

PROMPTS = [
    "Give me a number.",
    "What is 12 times 3?",
    "Count the sunny days in Paris.",
    "How many degrees is it in Tokyo today?",
]
AFTER_UPDATE = 8  # tasks of the batch after the new weights
HEAVY = ("ray", "pyarrow", "vllm", "torch", "numpy", "aiohttp")
NOT_INSTALLED = ("ray", "pyarrow", "vllm")  # the venv holds the client and pydantic alone


def tasks(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "task_id": f"{prefix}-{i}",
            "prompt": f"{PROMPTS[i % len(PROMPTS)]} ({i})",
            "environment": "digits",
        }
        for i in range(count)
    ]


def read(client: Any, batch_id: str) -> dict[str, Any]:
    """Every row of the batch from its stream: keys, token ids, versions, timing."""
    started = time.perf_counter()
    keys: Counter[tuple[str, int]] = Counter()
    versions: Counter[int] = Counter()
    cursors, first_s, without_ids, statuses = [], None, 0, Counter()
    for item in client.stream(batch_id):
        if first_s is None:
            first_s = time.perf_counter() - started
        row = item.trajectory
        cursors.append(item.cursor)
        keys[row.key] += 1
        statuses[row.status] += 1
        for turn in row.turns:
            versions[turn.policy_version] += 1
            if not (turn.prompt_token_ids and turn.completion_token_ids):
                without_ids += 1
            if len(turn.logprobs) != len(turn.completion_token_ids):
                without_ids += 1
    return {
        "rows": sum(keys.values()),
        "distinct": len(keys),
        "most_per_key": max(keys.values()) if keys else 0,
        "cursors_in_order": cursors == list(range(len(cursors))),
        "turn_versions": {str(v): c for v, c in sorted(versions.items())},
        "turns_without_token_ids": without_ids,
        "statuses": dict(statuses),
        "first_row_s": first_s,
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    url, token_file, count, n, checkpoint = sys.argv[1:6]
    ray_installed = importlib.util.find_spec("ray") is not None
    installed = [name for name in NOT_INSTALLED if importlib.util.find_spec(name) is not None]
    from rayrollout.client import RolloutClient

    heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
    client = RolloutClient(url, token_file=token_file)
    before = client.stats().policy.version
    submitted = time.perf_counter()
    batch = client.submit(tasks("t", int(count)), n=int(n))
    first = read(client, batch.batch_id)
    first["submit_to_end_s"] = time.perf_counter() - submitted
    paused = client.pause("wait")
    update = client.update_weights(checkpoint)
    resumed = client.resume()
    second = read(client, client.submit(tasks("after", AFTER_UPDATE), n=int(n)).batch_id)
    report = {
        "python": sys.version.split()[0],
        "ray_installed": ray_installed,
        "installed": installed,
        "heavy_modules": heavy,
        "version_before": before,
        "samples": batch.samples,
        "first": first,
        "paused_calls_in_flight": paused.calls_in_flight,
        "update": update.model_dump(),
        "resumed_version": resumed.version,
        "second": second,
        "output_dir": client.output_dir(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
