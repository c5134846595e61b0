"""Placement by node role: policy replicas on the GPU-role node, environments and workers not."""

from __future__ import annotations

from collections import defaultdict

import pytest
import ray
from ray.util.state import list_actors
from raycluster import run_config

from rayrollout import RolloutEngine

pytestmark = pytest.mark.cluster


def nodes_with(resource: str) -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]}


def actor_nodes(prefix: str) -> dict[str, set[str]]:
    """Alive actors whose class name starts with ``prefix``: class name -> node ids."""
    found: dict[str, set[str]] = defaultdict(set)
    for actor in list_actors(detail=True, filters=[("state", "=", "ALIVE")], limit=10_000):
        if actor.class_name.startswith(prefix):
            found[actor.class_name].add(actor.node_id)
    return found


def test_policy_replicas_run_only_on_gpu_nodes_and_environments_only_elsewhere(
    tmp_path, ray_cluster, serve_port
):
    config = run_config(
        tmp_path,
        serve_port,
        "placement",
        policy={"scripted": {"replicas": 2}},
        environments={"counter": {"path": "fixture_envs:CounterEnv", "replicas": 2}},
        workers={"num_workers": 2},
    )
    tasks = [
        {"task_id": f"c{i}", "prompt": f"count {i}", "environment": "counter"} for i in range(8)
    ]
    with RolloutEngine(config) as engine:
        result = engine.collect(tasks, num_repeats=2)
        policy = actor_nodes("ServeReplica:placement.policy:")
        envs = actor_nodes("ServeReplica:placement.env.counter:")
        workers = actor_nodes("WorkerActor")
        engines = actor_nodes("EngineActor")
    rows = result.trajectories()
    assert len(rows) == 16
    assert {r.status for r in rows} == {"ok"} and {r.reward for r in rows} == {1.0}

    gpu_nodes, cpu_nodes = nodes_with("gpu_node"), nodes_with("cpu_node")
    assert len(gpu_nodes) == 1 and len(cpu_nodes) == 1
    assert policy and set().union(*policy.values()) <= gpu_nodes
    replicas = [
        a
        for a in list_actors(detail=True, filters=[("state", "=", "ALIVE")], limit=10_000)
        if a.class_name.startswith("ServeReplica:placement.")
    ]
    assert sum(a.class_name.startswith("ServeReplica:placement.policy:") for a in replicas) == 2
    env_nodes = set().union(*envs.values())
    assert env_nodes and env_nodes <= cpu_nodes and not env_nodes & gpu_nodes
    assert set().union(*workers.values()) <= cpu_nodes
    assert set().union(*engines.values()) <= cpu_nodes
