"""The trainers tier's engine: ``rayrollout up``'s detached engine and HTTP service, with a
policy that answers token ids and logprobs (``token_policy``), on the shipped weather
environment (multi-turn tool episodes). Each trainer runs in its own venv
(``.venv-trainers-*``, built by ``.ci/trainers``) and reaches the service over HTTP.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rayrollout import RunConfig
from rayrollout.api.cluster import down, service_url, start_detached
from rayrollout.auth import read_token_file
from rayrollout.engine.secret_env import route_token_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
NAMESPACE = "trainers-tests"


@pytest.fixture(scope="session")
def service(tmp_path_factory, serve_session) -> Iterator[dict[str, Any]]:
    from token_policy import TokenPolicy

    with TokenPolicy() as policy:
        config = RunConfig.model_validate(
            {
                "namespace": NAMESPACE,
                "environment": "weather",
                "policy": {"kind": "openai", "base_url": policy.base_url, "model": "tokens"},
                "workers": {"num_workers": 1},
                "concurrency": 8,
                "output": {"dir": str(tmp_path_factory.mktemp("trainers") / "out")},
                "ray": {"serve_port": serve_session},
                "service": {"port": 0},
            }
        )
        start_detached(config)
        try:
            yield {
                "url": service_url(NAMESPACE),
                "token": read_token_file(route_token_path(NAMESPACE)),
                "policy": policy,
            }
        finally:
            down(NAMESPACE)
