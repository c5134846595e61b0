"""Live metrics reach Ray's Prometheus endpoint while a run goes on."""

import time
import urllib.request

from rayrollout import RolloutEngine
from rayrollout.engine.metrics import METRIC_NAMES


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_documented_metrics_appear_with_sensible_values(tmp_path, serve_session, metrics_port):
    config = {
        "namespace": "metrics-test",
        "environments": {"echo": {"path": "fixture_envs:EchoEnv"}},
        "output": {"dir": str(tmp_path / "out")},
        "ray": {"serve_port": serve_session},
    }
    tasks = [{"task_id": f"m{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(12)]
    ours = {"namespace": "metrics-test"}
    # Each process (engine, workers) exports its own series in periodic batches, and earlier
    # tests' series carry the same names: wait for this run's counts, not only the names.
    wanted = [
        ("ray_rayrollout_episodes_finished", {"environment": "echo", "status": "ok"}, 12),
        ("ray_rayrollout_reward_count", {}, 12),
        ("ray_rayrollout_policy_call_seconds_count", {}, 24),
        ("ray_rayrollout_tool_call_seconds_count", {"tool": "echo"}, 12),
    ]

    def arrived(text: str) -> bool:
        return all(sample(text, name, **ours, **labels) == n for name, labels, n in wanted)

    with RolloutEngine(config) as engine:
        engine.collect(tasks)
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            text = scrape(metrics_port)
            if arrived(text) and all(f"ray_{name}" in text for name in METRIC_NAMES):
                break
            time.sleep(2)
    for name in METRIC_NAMES:
        assert f"ray_{name}" in text, f"{name} not exported"
    finished = sample(
        text, "ray_rayrollout_episodes_finished", **ours, environment="echo", status="ok"
    )
    assert finished == 12
    assert sample(text, "ray_rayrollout_episodes_submitted", namespace="metrics-test") == 12
    assert sample(text, "ray_rayrollout_reward_count", namespace="metrics-test") == 12
    # every reward was 1.0: all 12 observations lie between the buckets that bound 1
    assert sample(text, "ray_rayrollout_reward_bucket", namespace="metrics-test", le="0.9999") == 0
    assert sample(text, "ray_rayrollout_reward_bucket", namespace="metrics-test", le="1.0001") == 12
    assert sample(text, "ray_rayrollout_policy_call_seconds_count", namespace="metrics-test") == 24
    assert sample(text, "ray_rayrollout_episodes_in_flight", namespace="metrics-test") == 0
    tool_calls = sample(
        text, "ray_rayrollout_tool_call_seconds_count", namespace="metrics-test", tool="echo"
    )
    assert tool_calls == 12
