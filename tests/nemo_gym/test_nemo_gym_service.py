"""NeMo Gym 0.7.0's own ``ng_collect_rollouts`` with rayrollout's rollout service as its agent.

An engine and its HTTP service are started as ``rayrollout up`` starts them (the scripted
policy standing in for the model's judgement); NeMo Gym's ``ng_run`` starts the agent
entrypoint rayrollout ships (``rayrollout_service``, relaying ``/run`` and
``/aggregate_metrics`` to the service with its token) and NeMo Gym's own ``legacy_agent``
environment server in front of it; NeMo Gym's collector then posts each row to ``/run``.
Each row names its reward (``rewards``, read by the test environment), so the rollouts
NeMo Gym writes must carry exactly those.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ngrun import NemoGymRun

from rayrollout import RunConfig
from rayrollout.api.cluster import down, service_url, start_detached
from rayrollout.engine.secret_env import route_token_path
from rayrollout.envkit.nemo_gym.ng_run_config import nemo_gym_root, service_agent_block

NAMESPACE = "ng-service"
REWARDS = [1.0, 0.0, 0.5, -1.0]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, serve_session: int) -> Iterator[str]:
    config = RunConfig.model_validate(
        {
            "namespace": NAMESPACE,
            "environments": {"scheduled": {"path": "fixture_envs:ScheduledRewardEnv"}},
            "environment": "scheduled",
            "workers": {"num_workers": 1},
            "output": {"dir": str(tmp_path_factory.mktemp("ng-service") / "out")},
            "ray": {"serve_port": serve_session},
            "service": {"port": 0},
        }
    )
    start_detached(config)
    try:
        url = service_url(NAMESPACE)
        assert url is not None
        yield url
    finally:
        down(NAMESPACE)


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": f"note {i}"}]},
            "rewards": [reward],
        }
        for i, reward in enumerate(REWARDS)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def test_ng_collect_rollouts_drives_the_rollout_service_through_the_shipped_agent(
    service: str, ng_src: Path, tmp_path: Path
) -> None:
    tasks = tmp_path / "rows.jsonl"
    rows = _rows(tasks)
    blocks = service_agent_block("rayrollout_agent", service, str(route_token_path(NAMESPACE)))
    run = NemoGymRun(blocks, tmp_path, {"NEMO_GYM_EXTRA_ROOTS": str(nemo_gym_root())})
    output = tmp_path / "rollouts.jsonl"
    try:
        run.start()
        collected = run.collect_rollouts("rayrollout_agent", tasks, output)
    finally:
        run.stop()
    log = collected.stdout[-3000:] + collected.stderr[-3000:] + run.log()[-3000:]
    assert collected.returncode == 0, log
    rollouts = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
    assert len(rollouts) == len(rows), log
    # Each rollout is its row's episode, scored as the row says, with the episode itself.
    by_prompt = {r["responses_create_params"]["input"][0]["content"]: r for r in rollouts}
    for i, reward in enumerate(REWARDS):
        rollout = by_prompt[f"note {i}"]
        assert rollout["reward"] == reward, rollout
        kinds = [item["type"] for item in rollout["response"]["output"]]
        assert kinds == ["function_call", "function_call_output", "message"], kinds
    # The collector asked for /aggregate_metrics through the relay and wrote the answer.
    (aggregate,) = json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_text())
    assert aggregate["agent_metrics"]["num_rollouts"] == len(rows)
    assert aggregate["agent_metrics"]["mean/reward"] == pytest.approx(sum(REWARDS) / len(REWARDS))
