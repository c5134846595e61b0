"""Shared pytest fixtures and the one gate of tests that need a system package.

One local Ray (and Serve) per test session, shut down at the end.

A test that needs something ``pip`` does not install (bubblewrap for the code sandbox,
Chromium for the report page, Slurm and munge for the cluster tier) says so with
``@pytest.mark.system_package("bubblewrap")``; where the package is missing it is skipped
with a reason naming the package and the command that installs it. CI installs them all and
sets ``RAYROLLOUT_REQUIRE_SYSTEM_PACKAGES=bubblewrap,chromium,slurm``: there a missing one
fails the test instead, so a green CI run never hides a skipped sandbox or browser test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayrollout.ports import free_port

REQUIRE_VARIABLE = "RAYROLLOUT_REQUIRE_SYSTEM_PACKAGES"
"""Comma-separated packages that must be present (CI): a test needing a missing one fails."""

SYSTEM_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    # package: (the programs a test runs, found on PATH or in /usr/sbin; how to install it)
    "bubblewrap": (("bwrap",), "apt-get install bubblewrap"),
    "chromium": (("chromium",), "apt-get install chromium"),
    "slurm": (
        ("munged", "slurmctld", "slurmd", "sbatch", "scontrol"),
        "apt-get install slurm-wlm munge",
    ),
}


def missing_programs(package: str) -> list[str]:
    """The programs of ``package`` this machine lacks (empty: it is installed)."""
    programs, _ = SYSTEM_PACKAGES[package]
    return [p for p in programs if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def required_packages() -> set[str]:
    """The packages ``RAYROLLOUT_REQUIRE_SYSTEM_PACKAGES`` names; an unknown name is an error."""
    named = {p.strip() for p in os.environ.get(REQUIRE_VARIABLE, "").split(",") if p.strip()}
    unknown = sorted(named - set(SYSTEM_PACKAGES))
    if unknown:
        raise pytest.UsageError(
            f"{REQUIRE_VARIABLE} names unknown system package(s) {', '.join(unknown)}: "
            f"known ones are {', '.join(sorted(SYSTEM_PACKAGES))}"
        )
    return named


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "system_package(name): needs a system package ("
        + ", ".join(sorted(SYSTEM_PACKAGES))
        + f"); skipped naming it where it is missing, failed where {REQUIRE_VARIABLE} names it",
    )
    required_packages()  # a typo in CI's list stops the run before any test
    # Ray starts its workers at nice 15. A test waits at nice 0 for actors that then get a
    # sliver of a busy machine (weight 36 against 1,024 per busy process), so its deadlines
    # measure the load, not the code. At pytest's own priority, load slows both sides alike.
    # Set here, before any Ray starts: the session's Ray and the Rays that `rayrollout`
    # subprocesses start inherit it.
    os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("system_package"):
        for package in mark.args:
            if package not in SYSTEM_PACKAGES:
                raise pytest.UsageError(
                    f"{item.nodeid}: unknown system_package {package!r}; known ones are "
                    f"{', '.join(sorted(SYSTEM_PACKAGES))} (conftest.py)"
                )
            missing = missing_programs(package)
            if not missing:
                continue
            _, install = SYSTEM_PACKAGES[package]
            reason = f"{package} is not installed (no {', '.join(missing)}): {install}"
            if package in required_packages():
                pytest.fail(f"{reason}; {REQUIRE_VARIABLE} says it must be here", pytrace=False)
            pytest.skip(reason)


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
    # Serve's controller kills an HTTP proxy that is not ready within 5 s of starting; on a
    # loaded machine (CI builds two venvs beside the default tier) a new proxy takes longer.
    # The same patience the engine gives its own Serve (engine/services.py), for this
    # session's Ray only: set while it starts (its processes inherit them), then taken back,
    # so the programs tests start (ng_run, `rayrollout env serve`) keep their own defaults.
    patience = {
        name: "60"
        for name in (
            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S",
            "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S",
        )
        if name not in os.environ
    }
    os.environ.update(patience)
    # Actors import test environments (tests/fixture_envs.py) by module path.
    root = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.join(root, "tests")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (tests, root, os.environ.get("PYTHONPATH")) if p
    )
    METRICS_PORT.append(free_port())
    ray.init(
        address="local",  # not the head a `ray start` (or `rayrollout up`) left on the machine
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        namespace="rayrollout-tests",
        _metrics_export_port=METRICS_PORT[0],
    )
    for name in patience:
        os.environ.pop(name, None)
    yield
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@pytest.fixture(autouse=True)
def serve_apps_deleted(request: pytest.FixtureRequest) -> Iterator[None]:
    """The Serve applications a test deployed are deleted after it. The session's Ray and
    Serve are shared, and every replica left behind (a test's policy, its environments) holds
    about 200 MB and keeps polling: dozens of them slow every later test on 2 cores.
    Applications that a module- or session-scoped fixture deployed were there before the
    test, so they stay for the tests that share them."""
    if "serve_session" not in request.fixturenames:
        yield
        return
    from ray import serve

    before = set(serve.status().applications)
    yield
    for name in set(serve.status().applications) - before:
        serve.delete(name, _blocking=False)  # the controller tears it down beside the next test


@pytest.fixture(scope="session")
def serve_session(ray_session: None) -> int:
    """Ray Serve with its HTTP proxy on a free loopback port; returns the port."""
    from ray import serve
    from ray.exceptions import RayActorError

    port = free_port()
    for attempt in range(3):  # a proxy that died while starting is started again, as a run does
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            break
        except RayActorError:
            if attempt == 2:
                raise
    return port
