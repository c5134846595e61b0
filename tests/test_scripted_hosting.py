"""The scripted policy hosted by a plain Ray actor (``policy.scripted.hosting: actor``).

The same OpenAI routes and answers as the Serve app, behind the run's bearer token, ended
with the engine that started it; refused for an engine that outlives its driver.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import ray

from rayrollout.api.rollout_engine import RolloutEngine
from rayrollout.auth import RouteAuth
from rayrollout.data.config import ConfigError, RunConfig
from rayrollout.deployments.scripted.kind import build_scripted_app
from rayrollout.deployments.scripted.protocol import chat_answer
from rayrollout.policy.kinds import OwnServer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def _call(url: str, token: str | None, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _config(**scripted: Any) -> RunConfig:
    return RunConfig.model_validate(
        {"namespace": "scripted-hosting", "policy": {"scripted": {"hosting": "actor", **scripted}}}
    )


def test_the_actor_answers_the_serve_apps_routes_behind_the_token(ray_session):
    own = build_scripted_app(_config(), RouteAuth.bearer("secret"))
    assert isinstance(own, OwnServer)
    stop = own.start()
    try:
        assert _call(f"{own.base_url}/models", None)[0] == 401
        assert _call(f"{own.base_url}/models", "wrong")[0] == 401
        status, models = _call(f"{own.base_url}/models", "secret")
        assert status == 200 and models["data"][0]["id"] == "scripted"
        body = {"model": "scripted", "messages": [{"role": "user", "content": "Weather in Paris?"}]}
        body["tools"] = TOOLS
        status, answer = _call(f"{own.base_url}/chat/completions", "secret", body)
        assert status == 200
        expected = chat_answer(body, "scripted", 0)
        assert (
            answer["choices"][0]["message"]["tool_calls"][0]["function"]
            == (expected["choices"][0]["message"]["tool_calls"][0]["function"])
        )
        status, response = _call(
            f"{own.base_url}/responses", "secret", {"model": "scripted", "input": "Say hi"}
        )
        assert status == 200 and response["object"] == "response" and response["output"]
    finally:
        stop()
    assert _eventually(lambda: not _listens(f"{own.base_url}/models"))  # ray.kill is async


def test_an_engine_plays_against_it_and_ends_it(ray_session, tmp_path):
    config = _config().model_dump()
    config["output"] = {"dir": str(tmp_path / "out")}
    config["environments"] = {"echo": {"path": "fixture_envs:EchoEnv"}}
    with RolloutEngine(config) as engine:
        engine.start()
        assert engine.policy_url.startswith("http://127.0.0.1:")
        assert any(name.startswith("scripted-policy-") for name in _actor_names())
        result = engine.collect([{"task_id": "t", "prompt": "say hi", "environment": "echo"}])
        [trajectory] = result.trajectories()
        assert trajectory.status == "ok", trajectory.error
    assert _eventually(
        lambda: not any(name.startswith("scripted-policy-") for name in _actor_names())
    )


def _actor_names() -> set[str]:
    return {info["name"] for info in ray.util.list_named_actors(all_namespaces=True)}


def _listens(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
    except urllib.error.HTTPError:  # it answered (401 without a token)
        return True
    except OSError:
        return False
    return True


def _eventually(condition: Callable[[], bool], within_s: float = 60.0) -> bool:
    """Whether ``condition`` holds within ``within_s`` (an actor's end is not instant)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_an_engine_that_outlives_its_driver_refuses_it_before_ray_starts():
    with pytest.raises(ConfigError, match="hosting 'actor'.*needs 'serve'"):
        RolloutEngine(_config()).start(detached=True)


def test_the_demo_hosts_its_policy_on_an_actor_only_on_a_ray_of_its_own(monkeypatch):
    from rayrollout.cli.demo import demo_defaults

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert demo_defaults(RunConfig()) == {
        "workers": {"num_workers": 1},
        "policy": {"scripted": {"hosting": "actor"}},
    }
    # On a cluster the actor would listen on the driver's node only: Serve's proxy is on all.
    assert demo_defaults(RunConfig.model_validate({"ray": {"address": "auto"}})) == {
        "workers": {"num_workers": 1}
    }
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert "policy" not in demo_defaults(RunConfig())
    # A config that names either setting keeps its own.
    named = RunConfig.model_validate(
        {"workers": {"num_workers": 3}, "policy": {"scripted": {"hosting": "serve"}}}
    )
    monkeypatch.delenv("RAY_ADDRESS")
    assert demo_defaults(named) == {}
