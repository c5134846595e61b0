"""Node roles -> where each part of a run is scheduled.

The config's ``placement`` names the Ray custom resources that mark GPU and CPU nodes;
policy replicas require a sliver of the first, workers, environment replicas and the engine
of the second, which marks a role without capping actors per node. Unset: no constraint.
"""

from __future__ import annotations

from typing import Any

from rayrollout.data.config import RunConfig

__all__ = [
    "cpu_actor_options",
    "policy_actor_options",
    "worker_actor_options",
]


def policy_actor_options(config: RunConfig, options: dict[str, Any]) -> dict[str, Any]:
    """Ray actor options of a policy replica: ``options`` plus the GPU-node role, if named."""
    return config.placement.gpu_options(options)


def cpu_actor_options(config: RunConfig, options: dict[str, Any]) -> dict[str, Any]:
    """Ray actor options of an environment replica or the engine: plus the CPU-node role."""
    return config.placement.cpu_options(options)


def worker_actor_options(config: RunConfig, options: dict[str, Any]) -> dict[str, Any]:
    """Ray actor options of a worker: the CPU-node role, spread across the nodes that have it."""
    merged = cpu_actor_options(config, options)
    if config.placement.spread_workers:
        merged["scheduling_strategy"] = "SPREAD"
    return merged
