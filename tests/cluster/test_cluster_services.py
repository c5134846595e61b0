"""Service discovery, namespaces, autoscaling with backpressure, and up/status/down."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
import ray
from ray.util.state import list_actors
from raycluster import VENV_BIN, run_config

from rayrollout import RolloutEngine, RunConfig
from rayrollout.api.cluster import NotUpError, down, lookup_app, lookup_engine, status, up

pytestmark = pytest.mark.cluster


def weather_tasks(prefix: str, n: int) -> list[dict]:
    return [
        {
            "task_id": f"{prefix}{i}",
            "prompt": f"What's the weather like in {prefix}{i}?",
            "environment": "weather",
        }
        for i in range(n)
    ]


def test_two_namespaces_on_one_cluster_do_not_see_each_other(tmp_path, ray_cluster, serve_port):
    a = RunConfig.model_validate(run_config(tmp_path / "a", serve_port, "iso-a"))
    b = RunConfig.model_validate(run_config(tmp_path / "b", serve_port, "iso-b"))
    with RolloutEngine(a) as engine_a, RolloutEngine(b) as engine_b:
        engine_a.start()
        engine_b.start()  # the same names in another namespace: no clash
        named = {(x["namespace"], x["name"]) for x in ray.util.list_named_actors(True)}
        assert {
            ("iso-a", "engine"),
            ("iso-b", "engine"),
            ("iso-a", "worker:0"),
            ("iso-b", "worker:0"),
        } <= named
        assert lookup_engine("iso-a")._actor_id != lookup_engine("iso-b")._actor_id
        result_a = engine_a.collect(weather_tasks("a", 3))
        result_b = engine_b.collect(weather_tasks("b", 4))
    assert sorted(t.task_id for t in result_a.trajectories()) == ["a0", "a1", "a2"]
    assert sorted(t.task_id for t in result_b.trajectories()) == ["b0", "b1", "b2", "b3"]
    with pytest.raises(NotUpError):
        lookup_engine("iso-a", timeout_s=0.5)  # its run ended: nothing left behind


def test_lookup_of_a_service_not_up_retries_then_names_it_and_the_command(ray_cluster):
    started = time.monotonic()
    with pytest.raises(NotUpError) as engine_error:
        lookup_engine("nobody-here", timeout_s=1.5)
    assert time.monotonic() - started >= 1.5
    message = str(engine_error.value)
    assert "no rayrollout engine in Ray namespace 'nobody-here'" in message
    assert "rayrollout up --config FILE --namespace nobody-here" in message
    with pytest.raises(NotUpError) as app_error:
        lookup_app("nobody-here", "env.code", timeout_s=0.5)
    assert "Serve application 'nobody-here.env.code' is not running" in str(app_error.value)
    assert "rayrollout up --config FILE --namespace nobody-here" in str(app_error.value)


def test_slow_environment_scales_up_during_a_run_and_episodes_wait_instead_of_timing_out(
    tmp_path, ray_cluster, serve_port
):
    autoscaling = {
        "min_replicas": 1,
        "max_replicas": 3,
        "target_ongoing_requests": 1,
        "upscale_delay_s": 0.5,
        "downscale_delay_s": 60,
        "max_ongoing_requests": 2,
    }
    config = run_config(
        tmp_path,
        serve_port,
        "auto",
        concurrency=12,
        environments={"slow": {"path": "cluster_envs:SlowEnv", "autoscaling": autoscaling}},
    )
    tasks = [{"task_id": f"s{i}", "prompt": f"slow {i}", "environment": "slow"} for i in range(60)]
    replicas_seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            alive = list_actors(detail=True, filters=[("state", "=", "ALIVE")], limit=10_000)
            replicas_seen.append(
                sum(a.class_name.startswith("ServeReplica:auto.env.slow:") for a in alive)
            )
            time.sleep(1.0)

    watcher = threading.Thread(target=watch, daemon=True)
    with RolloutEngine(config) as engine:
        watcher.start()
        try:
            result = engine.collect(tasks)
        finally:
            stop.set()
            watcher.join(timeout=30)
    rows = result.trajectories()
    assert len(rows) == 60
    assert {r.status for r in rows} == {"ok"}, {r.error for r in rows}  # waited, never timed out
    assert min(replicas_seen) <= 1  # started at one
    assert max(replicas_seen) >= 2, replicas_seen
    from ray import serve

    serve.delete("auto.env.slow")
    serve.delete("auto.policy")


def test_up_starts_detached_services_that_collect_attaches_to_and_down_removes(
    tmp_path, ray_cluster, serve_port
):
    data = run_config(
        tmp_path,
        serve_port,
        "svc",
        environments={"counter": {"path": "fixture_envs:CounterEnv", "replicas": 1}},
    )
    state = up(RunConfig.model_validate(data))
    assert state["engine"]["up"] is True
    assert {"svc.policy", "svc.env.counter"} <= set(state["apps"])
    engine_id = lookup_engine("svc")._actor_id

    shown = subprocess.run(
        [str(VENV_BIN / "rayrollout"), "status", "--namespace", "svc"],
        env=ray_cluster.env() | {"RAY_ADDRESS": ray_cluster.address},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    listed = json.loads(shown.stdout)
    assert listed["engine"]["up"] is True and len(listed["workers"]) == 2
    assert listed["service"]["url"] == state["service"]["url"]
    assert sum(listed["apps"]["svc.env.counter"]["replicas_per_node"].values()) == 1

    # A driver of the same namespace attaches instead of starting its own engine.
    with RolloutEngine(RunConfig.model_validate(data)) as engine:
        result = engine.collect(weather_tasks("u", 3))
        assert engine.attached
    assert len(result.trajectories()) == 3
    assert lookup_engine("svc")._actor_id == engine_id  # still up after the driver left

    removed = down("svc")
    assert "actor svc/engine" in removed and "serve app svc.policy" in removed
    assert "actor svc/service" in removed  # the HTTP rollout service `up` started
    assert status("svc") == {
        "namespace": "svc",
        "engine": {"up": False},
        "service": {"up": False},
        "apps": {},
        "workers": {},
    }
