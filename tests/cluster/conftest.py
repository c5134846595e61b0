"""One three-node Ray cluster for the ``cluster`` tier: head, GPU-role node, CPU-role node.

The node roles are the custom resources ``gpu_node`` and ``cpu_node``; runs name them in
their ``placement`` section. Started once per session (about 15 s) and torn down by PID.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from raycluster import RayTestCluster, free_port_block

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayTestCluster]:
    """Head (1 CPU) + GPU-role node (1 CPU, gpu_node) + CPU-role node (2 CPUs, cpu_node)."""
    import ray

    # Short: Ray's socket paths under it must stay below 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="rrc-", dir="/tmp"))
    cluster = RayTestCluster(
        temp_dir, log_dir=tmp_path_factory.mktemp("raynodes"), extra_pythonpath=[HERE]
    )
    try:
        cluster.start_head(num_cpus=1)
        cluster.wait_for_head()
        for key, value in cluster.env().items():
            if key.startswith("RAY_") or key == "PYTHONPATH":
                os.environ[key] = value
        # The state API and the CLI (run as subprocesses) find this cluster by RAY_ADDRESS.
        os.environ["RAY_ADDRESS"] = cluster.address
        ray.init(address=cluster.address, namespace="cluster-tests", log_to_driver=False)
        # One node at a time: nodes of one host starting together race for socket names.
        cluster.add_node("gpu", num_cpus=1, resources={"gpu_node": 1})
        cluster.wait_for_nodes(2)
        cluster.add_node("cpu", num_cpus=2, resources={"cpu_node": 1})
        cluster.wait_for_nodes(3)
        yield cluster
    finally:
        from ray import serve

        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
            cluster.stop()
            os.environ.pop("RAY_ADDRESS", None)
            shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def serve_port(ray_cluster: RayTestCluster) -> int:
    """Serve's HTTP port for every run of the tier (one Serve per cluster)."""
    return free_port_block(1)
