"""A throwaway three-node Ray cluster on this machine, for the ``cluster`` test tier.

Each node is ``ray start --block`` in its own process group (ended by PID, never ``ray stop``,
which would stop every Ray on a shared machine), with every port given explicitly below
32768 (ports in the ephemeral range collide: notes/ray-cluster.md). Token authentication is
turned off on every process of this cluster only (``RAY_AUTH_MODE=disabled``); a real
cluster keeps it on and sets ``RAY_AUTH_MODE=token`` on its clients.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from netutil import port_is_free

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PORTS_PER_NODE = 40


def free_port_block(size: int, low: int = 12000, high: int = 32000) -> int:
    """First port of ``size`` consecutive free ports in [low, high) (below the ephemeral range)."""
    for _ in range(200):
        base = random.randrange(low, high - size)
        if all(port_is_free(p) for p in range(base, base + size)):
            return base
    raise RuntimeError(f"no {size} consecutive free ports between {low} and {high}")


def cluster_env(extra_pythonpath: list[Path] | None = None) -> dict[str, str]:
    """Environment of every process of the test cluster (nodes, drivers, job clients)."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    paths = [str(p) for p in (extra_pythonpath or [])] + [str(ROOT / "tests"), str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(paths),
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    return env


@dataclass
class RayTestCluster:
    """A head plus worker nodes, each with its own custom resources and port block."""

    temp_dir: Path
    log_dir: Path
    extra_pythonpath: list[Path] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gcs_port: int = 0
    dashboard_port: int = 0
    logs: list[Path] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        return cluster_env(self.extra_pythonpath)

    def _node_ports(self, base: int) -> list[str]:
        return [
            f"--node-manager-port={base + 1}",
            f"--object-manager-port={base + 2}",
            f"--runtime-env-agent-port={base + 3}",
            f"--dashboard-agent-grpc-port={base + 4}",
            f"--dashboard-agent-listen-port={base + 5}",
            f"--metrics-export-port={base + 6}",
            f"--min-worker-port={base + 10}",
            f"--max-worker-port={base + PORTS_PER_NODE - 1}",
        ]

    def _start(self, args: list[str], name: str) -> None:
        log = self.log_dir / f"{name}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(VENV_BIN / "ray"), "start", "--block", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,  # its own process group, ended by PID in stop()
            )
        self.procs.append(proc)

    def start_head(self, num_cpus: float, resources: dict[str, float] | None = None) -> None:
        base = free_port_block(PORTS_PER_NODE)
        self.gcs_port, self.dashboard_port = base, base + 7
        self._start(
            [
                "--head",
                f"--port={base}",
                f"--num-cpus={num_cpus}",
                f"--resources={json.dumps(resources or {})}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={base + 8}",
                f"--temp-dir={self.temp_dir / 'ray'}",
                *self._node_ports(base),
            ],
            "head",
        )

    def add_node(self, name: str, num_cpus: float, resources: dict[str, float]) -> None:
        base = free_port_block(PORTS_PER_NODE)
        self._start(
            [
                f"--address={self.address}",
                f"--num-cpus={num_cpus}",
                f"--resources={json.dumps(resources)}",
                *self._node_ports(base),
            ],
            name,
        )

    def wait_for_head(self, timeout_s: float = 240.0) -> None:
        """Wait until the head says it started (a loaded 2-core machine takes up to a minute)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "Ray runtime started" in self.logs[0].read_text(errors="replace"):
                return
            if self.procs[0].poll() is not None:
                raise RuntimeError(f"the Ray head exited early; see {self.logs[0]}")
            time.sleep(0.5)
        raise TimeoutError(f"Ray head not up after {timeout_s}s; see {self.logs[0]}")

    def wait_for_nodes(self, count: int, timeout_s: float = 240.0) -> None:
        """Wait until ``count`` nodes are alive, asking from this (connected) driver."""
        import ray

        deadline = time.monotonic() + timeout_s
        alive = 0
        while time.monotonic() < deadline:
            for proc, log in zip(self.procs, self.logs, strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"a Ray node exited early; see {log}")
            alive = sum(n["Alive"] for n in ray.nodes())
            if alive >= count:
                return
            time.sleep(1.0)
        raise TimeoutError(f"{alive} of {count} Ray nodes up after {timeout_s}s; see {self.logs}")

    def stop(self, grace_s: float = 15.0) -> None:
        """End every node's process group: SIGTERM, then SIGKILL after the grace period."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers the raylet left behind
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)


PLACEMENT = {"gpu_resource": "gpu_node", "cpu_resource": "cpu_node"}


def run_config(tmp_path: Path, serve_port: int, namespace: str, **overrides: object) -> dict:
    """A run's config on the test cluster: placed by role, Serve's proxy on the head only."""
    data: dict = {
        "namespace": namespace,
        "placement": PLACEMENT,
        "output": {"dir": str(tmp_path / "out")},
        "ray": {"serve_port": serve_port, "serve_proxy_location": "HeadOnly"},
        "concurrency": 16,
    }
    data.update(overrides)
    return data
