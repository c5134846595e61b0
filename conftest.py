"""Shared pytest fixtures: one local Ray (and Serve) per test session, shut down at the end."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (tests never bind other addresses)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


METRICS_PORT: list[int] = []  # Prometheus port of the session's Ray node


@pytest.fixture(scope="session")
def metrics_port(ray_session: None) -> int:
    """Port of the session Ray node's Prometheus metrics endpoint."""
    return METRICS_PORT[0]


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray for the whole session: fractional CPUs let every actor fit on 2 cores."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.pop("RAY_ADDRESS", None)  # always a fresh local Ray, never a user's cluster
    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")  # metrics tests wait less
    # Actors import test environments (tests/fixture_envs.py) by module path.
    root = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.join(root, "tests")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (tests, root, os.environ.get("PYTHONPATH")) if p
    )
    METRICS_PORT.append(free_port())
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        namespace="rayrollout-tests",
        _metrics_export_port=METRICS_PORT[0],
    )
    yield
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def serve_session(ray_session: None) -> int:
    """Ray Serve with its HTTP proxy on a free loopback port; returns the port."""
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return port
