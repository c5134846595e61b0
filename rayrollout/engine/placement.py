"""Node roles -> where each part of a run is scheduled.

A cluster marks its nodes with Ray custom resources (``ray start --resources
'{"gpu_node": 1}'``); the config's ``placement`` section names them. Policy replicas then
require a sliver of the GPU-node resource, and workers, environment replicas and the engine a
sliver of the CPU-node resource, so each lands only on nodes of its role. A sliver (0.001 by
default) marks a role without limiting how many actors a node takes: CPUs still do that.
With ``placement`` unset nothing is constrained and a single node runs everything.

Example:
    >>> from rayrollout.data.config import RunConfig
    >>> config = RunConfig.model_validate({"placement": {"gpu_resource": "gpu_node"}})
    >>> policy_actor_options(config, {"num_cpus": 0.1})
    {'num_cpus': 0.1, 'resources': {'gpu_node': 0.001}}
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
