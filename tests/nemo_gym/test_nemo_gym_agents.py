"""NeMo Gym's own ``simple_agent`` and ``ng_collect_rollouts`` on rayrollout environments.

Everything but the policy's judgement is NeMo Gym 0.7.0's: ``ng_run`` starts its model
server (``openai_model``, pointed at rayrollout's scripted policy on Serve, which speaks the
Responses API), its ``simple_agent``, and the resources server through the entrypoint
rayrollout ships (``rayrollout_env``, which runs ``rayrollout env serve`` at the block's
host:port); ``ng_collect_rollouts`` then plays the environment's own NeMo Gym task rows and
asks the resources server for ``/aggregate_metrics``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from ngrun import NemoGymRun, free_port, policy_model_block
from served_policy import scripted_policy_on_serve
from typer.testing import CliRunner

from rayrollout.cli.commands import app as cli_app
from rayrollout.cli.env_commands import descendants
from rayrollout.envkit.nemo_gym.ng_run_config import nemo_gym_root

ROOT = Path(__file__).resolve().parents[2]


def _weather_rows(tmp_path: Path) -> Path:
    return ROOT / "rayrollout" / "environments" / "weather" / "tasks_nemo_gym.jsonl"


def _math_rows(tmp_path: Path) -> Path:
    """The math environment's tasks as NeMo Gym rows, the gold answer as ``expected_result``
    (the name NeMo Gym's math datasets use)."""
    from rayrollout.data.convert import chat_tools_to_responses
    from rayrollout.envkit.registry import load_environment

    tools = chat_tools_to_responses(load_environment("math").tool_schemas())
    path = tmp_path / "math_nemo_gym.jsonl"
    with path.open("w") as out:
        for line in (
            (ROOT / "rayrollout" / "environments" / "math" / "tasks.jsonl").read_text().splitlines()
        ):
            task = json.loads(line)
            row = {
                "responses_create_params": {
                    "input": [{"role": "user", "content": task["prompt"]}],
                    "tools": tools,
                },
                "expected_result": task["expected_answer"],
            }
            out.write(json.dumps(row) + "\n")
    return path


CASES = {
    # environment: (its NeMo Gym task rows, the reward every scripted episode earns)
    "weather": (_weather_rows, 1.0),
    "math": (_math_rows, 1.0),
}


@pytest.fixture(scope="module")
def policy_url(serve_session: int) -> Iterator[str]:
    # NeMo Gym's openai_model sends its openai_api_key (below) as the bearer token.
    with scripted_policy_on_serve("ng-agents-policy", serve_session, "not-needed") as url:
        yield url


def _config(environment: str, policy: str, port: int) -> dict:
    """The config a NeMo Gym user pastes: ``rayrollout env nemo-gym-config`` plus their model
    server (NeMo Gym's ``openai_model``, here pointed at the scripted policy)."""
    printed = CliRunner().invoke(
        cli_app, ["env", "nemo-gym-config", environment, "--port", str(port)]
    )
    assert printed.exit_code == 0, printed.output
    assert f"NEMO_GYM_EXTRA_ROOTS={nemo_gym_root()}" in printed.output.splitlines()[0]
    return {**policy_model_block(policy), **yaml.safe_load(printed.output)}


def _wait_until_deployed(url: str, timeout_s: float = 300.0) -> None:
    """Wait for the environment app itself, not only its port.

    ng_run calls a server ready once its port accepts a connection; Serve's proxy listens
    before ``env serve`` has deployed the app behind it, and episodes sent in that window
    would test Serve's start-up, not the protocol.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=5).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the environment app at {url} was not deployed in {timeout_s:.0f} s")


@pytest.mark.parametrize("environment", sorted(CASES))
def test_ng_collect_rollouts_plays_a_rayrollout_environment_with_simple_agent(
    environment: str, policy_url: str, ng_src: Path, tmp_path: Path
) -> None:
    make_rows, expected_reward = CASES[environment]
    tasks = make_rows(tmp_path)
    rows = [json.loads(line) for line in tasks.read_text().splitlines() if line.strip()]
    roots = {"NEMO_GYM_EXTRA_ROOTS": str(nemo_gym_root())}
    port = free_port()
    run = NemoGymRun(_config(environment, policy_url, port), tmp_path, roots)
    try:
        run.start()
        _wait_until_deployed(f"http://127.0.0.1:{port}/")
        # env serve and its Ray: stop() gives them time to end on their own
        ours = run.watch(descendants(run.server_pid(f"rayrollout_{environment}")))
        output = tmp_path / "rollouts.jsonl"
        collected = run.collect_rollouts(f"{environment}_simple_agent", tasks, output)
    finally:
        run.stop()
    log = collected.stdout[-3000:] + collected.stderr[-3000:]
    assert collected.returncode == 0, log
    rollouts = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
    assert len(rollouts) == len(rows), log
    for rollout in rollouts:
        assert 0.0 <= rollout["reward"] <= 1.0
        if expected_reward is not None:
            assert rollout["reward"] == expected_reward, rollout
    # ng_collect_rollouts asked our /aggregate_metrics and wrote its answer beside them.
    (aggregate,) = json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_text())
    mean = sum(r["reward"] for r in rollouts) / len(rollouts)
    assert aggregate["agent_metrics"]["mean/reward"] == pytest.approx(mean)
    assert aggregate["agent_metrics"]["num_rollouts"] == len(rows)
    assert aggregate["key_metrics"]["mean/reward"] == pytest.approx(mean)
    assert len(aggregate["group_level_metrics"]) == len(rows)  # one group per task
    # ng_run's own shutdown ended `rayrollout env serve` and the Ray it started (NeMo Gym's
    # own Ray may leave processes of its own; those are not ours to judge).
    left = {pid: command for pid, command in run.leftovers.items() if pid in ours}
    assert not left, left
