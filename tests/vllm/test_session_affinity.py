"""Which Serve request router the vLLM app's LLMServer deployment gets (no vLLM needed: these
run in the default tier). The live checks, on a real app, are in test_replica_death.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rayrollout.deployments.vllm.app import (
    VllmDeploymentConfig,
    llm_config_kwargs,
    load_vllm_config,
)

ROOT = Path(__file__).resolve().parents[2]
CONSISTENT_HASH = "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter"


def deployment(**fields: object) -> dict:
    config = VllmDeploymentConfig(model_id="m", model_source="m", replicas=2, **fields)
    return llm_config_kwargs(config, "m")["deployment_config"]


def test_sessions_are_hashed_to_replicas_by_default_with_fallbacks():
    """An episode's calls reach one replica (its prefix cache); a full or dead one's calls go
    on to the next replicas in the ring instead of waiting."""
    options = deployment()
    assert options["num_replicas"] == 2
    assert options["request_router_config"] == {
        "request_router_class": CONSISTENT_HASH,
        "request_router_kwargs": {"num_fallback_replicas": 2},
    }
    strict = deployment(router_fallback_replicas=0)["request_router_config"]
    assert strict["request_router_kwargs"] == {"num_fallback_replicas": 0}


def test_every_shipped_deployment_file_keeps_affinity():
    for path in sorted((ROOT / "rayrollout/deployments/vllm").glob("*.yaml")):
        config = load_vllm_config(path)
        assert config.router == "consistent_hash", path.name
        options = llm_config_kwargs(config, "m")["deployment_config"]
        assert options["request_router_config"]["request_router_class"] == CONSISTENT_HASH


def test_other_routers_and_engine_metrics():
    assert "request_router_config" not in deployment(router="power_of_two")  # Serve's default
    prefix = deployment(router="prefix_aware")["request_router_config"]
    assert prefix == {
        "request_router_class": "ray.serve.llm.request_router:PrefixCacheAffinityRouter",
        "request_router_kwargs": {},
    }
    config = VllmDeploymentConfig(model_id="m", model_source="m")
    assert llm_config_kwargs(config, "m")["log_engine_metrics"] is False
    metered = config.model_copy(update={"engine_metrics": True})
    assert llm_config_kwargs(metered, "m")["log_engine_metrics"] is True


def test_an_unknown_router_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "vllm.yaml"
    path.write_text(yaml.safe_dump({"model_id": "m", "model_source": "m", "router": "random"}))
    with pytest.raises(ValueError, match="router"):
        load_vllm_config(path)


def test_the_router_class_is_importable_from_its_path():
    """Serve imports the class from this string in every process that routes: a path that
    went stale with a Ray upgrade would fail only when the app deploys."""
    from ray.serve._private.utils import import_attr

    assert import_attr(CONSISTENT_HASH).__name__ == "ConsistentHashRouter"
