"""PolicyClient against a real HTTP server that misbehaves on purpose."""

import asyncio

import pytest
from aiohttp import web
from netutil import served_routes
from old_parts import new_row, write_before_and_after

from rayrollout import Trajectory, read_trajectories
from rayrollout.data.config import PolicyConfig
from rayrollout.data.schema import Message, Turn
from rayrollout.policy.call import PolicyRequest
from rayrollout.policy.client import PolicyClient, PolicyError, PolicyTimeout

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


@pytest.fixture
async def flaky_server():
    """Answers with the queued failures first (status codes, 'hang' or 'garbage'), then succeeds."""
    state = {"failures": [], "requests": 0, "auth": []}

    async def chat(request: web.Request) -> web.StreamResponse:
        state["requests"] += 1
        state["auth"].append(request.headers.get("Authorization"))
        if state["failures"]:
            failure = state["failures"].pop(0)
            if failure == "hang":
                await asyncio.sleep(5)
            elif failure == "drop":  # the connection closes with no answer (a dead replica)
                assert request.transport is not None
                request.transport.abort()
                return web.Response()
            elif failure == "garbage":
                return web.Response(text="{not json", content_type="application/json")
            else:
                return web.json_response(
                    {"error": {"message": "try later"}},
                    status=failure,
                    headers={"retry-after-ms": "10"},
                )
        return web.json_response(ANSWER)

    # /v1/responses: its failures are all these tests need of it.
    async with served_routes({"/v1/chat/completions": chat, "/v1/responses": chat}) as base_url:
        yield base_url, state


def client(url, **config) -> PolicyClient:
    return PolicyClient(PolicyConfig(kind="openai", model="m", **config), url)


async def ask(policy: PolicyClient):
    try:
        return await policy.complete(PolicyRequest([Message(role="user", content="hello")]))
    finally:
        await policy.close()


async def test_429_and_5xx_are_retried_until_the_server_answers(flaky_server):
    url, state = flaky_server
    state["failures"] = [429, 503, 500]
    reply = await ask(client(url, max_retries=3))
    assert reply.message.content == "hi"
    assert state["requests"] == 4
    assert reply.turn.prompt_tokens == 3 and reply.turn.seconds > 0


async def test_a_call_answered_after_failed_tries_records_each_on_its_turn(flaky_server):
    """A replica that dies mid-call answers 500 (Serve's ingress) or drops the connection; the
    retry is answered elsewhere, and the turn says what the failed tries got."""
    url, state = flaky_server
    state["failures"] = [500, "drop", "hang", "garbage"]
    reply = await ask(client(url, timeout_s=0.5, max_retries=3))
    assert reply.message.content == "hi" and state["requests"] == 5
    turn = reply.turn
    assert turn.retries == 4 and len(turn.retry_errors) == 4, turn.retry_errors
    http_500, dropped, timeout, garbage = turn.retry_errors
    assert http_500 == "HTTP 500: try later"
    assert dropped.startswith(("ServerDisconnectedError", "ClientOSError")), dropped
    assert timeout == "timeout"
    assert "unusable answer" in garbage and len(garbage) <= 120


async def test_a_call_answered_at_once_records_no_retries(flaky_server):
    url, _ = flaky_server
    reply = await ask(client(url))
    assert (reply.turn.retries, reply.turn.retry_errors) == (0, [])


def test_rows_written_before_turns_recorded_retries_still_read(tmp_path):
    row = new_row(Turn(completion_token_ids=[1], retries=1, retry_errors=["HTTP 500: x"])).to_row()
    old_row = write_before_and_after(tmp_path / "out", row, {"retries", "retry_errors"})
    by_id = {t.task_id: t for t in read_trajectories(tmp_path / "out")}
    assert (by_id["old"].turns[0].retries, by_id["old"].turns[0].retry_errors) == (0, [])
    assert (by_id["new"].turns[0].retries, by_id["new"].turns[0].retry_errors) == (
        1,
        ["HTTP 500: x"],
    )
    assert Trajectory.from_row(old_row).turns[0].retries == 0  # a JSONL row


async def test_server_errors_past_the_retry_limit_become_a_policy_error(flaky_server):
    url, state = flaky_server
    state["failures"] = [500, 500, 500]
    with pytest.raises(PolicyError, match="answered HTTP 500"):
        await ask(client(url, max_retries=1))
    assert state["requests"] == 2


async def test_a_hanging_server_becomes_a_policy_timeout(flaky_server):
    url, state = flaky_server
    state["failures"] = ["hang", "hang"]
    with pytest.raises(PolicyTimeout, match="timed out after 0.3s"):
        await ask(client(url, timeout_s=0.3, max_retries=1))


async def test_garbage_json_is_a_policy_error(flaky_server):
    url, state = flaky_server
    state["failures"] = ["garbage"]
    with pytest.raises(PolicyError):
        await ask(client(url, max_retries=0))


async def test_api_key_is_sent_but_never_in_errors(flaky_server, monkeypatch):
    url, state = flaky_server
    monkeypatch.setenv("MY_POLICY_KEY", "sk-secret-123")
    state["failures"] = [401]
    with pytest.raises(PolicyError) as info:
        await ask(client(url, max_retries=0, api_key_env="MY_POLICY_KEY"))
    assert state["auth"] == ["Bearer sk-secret-123"]
    assert "sk-secret-123" not in str(info.value)


async def test_responses_api_failures_become_policy_errors(flaky_server):
    """The Responses API goes through the openai SDK, imported only when first used: its
    errors still end as PolicyError and PolicyTimeout, with the server's status."""
    url, state = flaky_server
    state["failures"] = [500, 500]
    with pytest.raises(PolicyError, match="answered HTTP 500"):
        await ask(client(url, api="responses", max_retries=1))
    assert state["requests"] == 2
    state["failures"] = ["hang"]
    with pytest.raises(PolicyTimeout, match="timed out after 0.3s"):
        await ask(client(url, api="responses", timeout_s=0.3, max_retries=0))


def test_responses_api_against_ray_serve_llm_is_refused_at_config_time():
    """The vLLM kind's own check, run when rayrollout takes the config (before anything
    starts): ``RolloutEngine`` and ``plan_collect`` call ``check_policy_kind``."""
    from rayrollout import RolloutEngine
    from rayrollout.api.preflight import check_policy_kind
    from rayrollout.data.config import ConfigError, load_config

    vllm = {"kind": "vllm", "vllm_config": "rayrollout/deployments/vllm/cpu.yaml"}
    with pytest.raises(ConfigError, match=r"policy.*no /v1/responses.*api: chat"):
        check_policy_kind(load_config(overrides={"policy": {**vllm, "api": "responses"}}))
    with pytest.raises(ConfigError, match=r"policy.*no /v1/responses.*api: chat"):
        RolloutEngine({"policy": {**vllm, "api": "responses"}})
    # Token-ids mode never calls /v1/responses, whatever 'api' says.
    config = load_config(
        overrides={"policy": {**vllm, "api": "responses", "prompt_mode": "token_ids"}}
    )
    assert check_policy_kind(config).kind.name == "vllm"
    assert config.policy.prompt_mode == "token_ids"


async def test_the_policy_client_satisfies_the_policy_protocol_the_episode_loop_declares():
    from rayrollout.policy.gate import PolicyGate
    from rayrollout.policy.protocol import Policy

    for gate in (None, PolicyGate()):
        client = PolicyClient(PolicyConfig(kind="openai", model="m"), "http://h/v1", gate=gate)
        try:
            assert isinstance(client, Policy)
        finally:
            await client.close()


def test_policy_kinds_are_found_by_name_beside_their_deployments():
    from rayrollout.policy.kinds import EXTERNAL, policy_kind

    assert policy_kind("openai") is EXTERNAL and EXTERNAL.build_app is None
    assert policy_kind("scripted").build_app.__module__ == "rayrollout.deployments.scripted.kind"
    assert policy_kind("vllm").build_app.__module__ == "rayrollout.deployments.vllm.kind"


def test_kind_vllm_with_a_base_url_attaches_to_that_app_and_sends_it_the_policy_key(monkeypatch):
    """A vLLM app already up (deployed by another run): the run deploys nothing, and both
    the workers' calls and the weight updates (its control routes) carry the policy key."""
    from pydantic import SecretStr

    from rayrollout.api.preflight import check_policy_kind
    from rayrollout.auth import RouteAuth
    from rayrollout.data.config import ConfigError, RunConfig
    from rayrollout.engine.secret_env import workers_policy_key
    from rayrollout.engine.startup import prepare_policy
    from rayrollout.engine.weights import WeightSync
    from rayrollout.policy.kinds import policy_kind

    monkeypatch.setenv("SHARED_VLLM_KEY", "the-apps-key")
    url = "http://127.0.0.1:8000/other-run/policy/v1"
    policy = {"kind": "vllm", "model": "tiny", "api_key_env": "SHARED_VLLM_KEY"}
    config = RunConfig.model_validate({"policy": {**policy, "base_url": url}})
    assert not policy_kind("vllm").deploys(config)
    assert prepare_policy(config, RouteAuth.bearer("run-token")) == (url, None)
    key = workers_policy_key(config, SecretStr("run-token"))
    assert key is not None and key.get_secret_value() == "the-apps-key"
    backend = WeightSync(config, url, [], key.get_secret_value()).backend
    assert backend.base == "http://127.0.0.1:8000/other-run/policy"
    assert backend.headers == {"Authorization": "Bearer the-apps-key"}

    deployed = RunConfig.model_validate({"policy": {**policy, "vllm_config": "cpu.yaml"}})
    assert policy_kind("vllm").deploys(deployed)
    assert workers_policy_key(deployed, SecretStr("run-token")).get_secret_value() == "run-token"
    both = RunConfig.model_validate({"policy": {**policy, "base_url": url, "vllm_config": "x"}})
    with pytest.raises(ConfigError, match="not both"):
        check_policy_kind(both)


@pytest.fixture
def fresh_policy_kinds():
    """The policy-kind caches emptied before and after, so a patched entry point list counts."""
    from rayrollout.policy import kinds

    kinds.POLICY_KINDS.clear()
    yield kinds
    kinds.POLICY_KINDS.clear()


def test_a_policy_kind_registered_twice_is_an_error_naming_both(monkeypatch, fresh_policy_kinds):
    from importlib.metadata import EntryPoint

    from rayrollout import plugins

    kinds = fresh_policy_kinds
    ours, theirs = "rayrollout.deployments.scripted.kind:SCRIPTED", "other_package.kind:SCRIPTED"
    twins = [EntryPoint("scripted", target, kinds.ENTRY_POINT_GROUP) for target in (ours, theirs)]
    monkeypatch.setattr(plugins, "entry_points", lambda group: twins)
    with pytest.raises(kinds.UnknownPolicyKindError) as raised:
        kinds.policy_kind("scripted")
    assert ours in str(raised.value) and theirs in str(raised.value)


async def test_the_gate_retries_only_its_own_abort_and_lets_a_timeout_through():
    """An aborted call runs in the episode's own task: the gate sends it again after resume,
    but a timeout or cancel of the episode that lands during the call still ends it."""
    from rayrollout.policy.call import PolicyReply
    from rayrollout.policy.gate import PolicyGate

    gate, sent = PolicyGate(), []

    async def send(kept: PolicyReply | None = None) -> PolicyReply:
        sent.append(gate.version)
        await asyncio.sleep(0.3)
        return PolicyReply(Message(role="assistant", content="hi"), Turn())

    call = asyncio.create_task(gate.call("e1", [], send))
    await asyncio.sleep(0.05)
    assert await gate.pause("abort_and_retry") == 1 and gate.idle.is_set()
    gate.resume(3)
    reply = await call
    assert sent == [0, 3] and reply.turn.policy_version == 3
    assert gate.counts["aborted"] == 1 and not gate.calls

    async def timed_out() -> None:
        async with asyncio.timeout(0.1):
            await gate.call("e2", [], send)

    with pytest.raises(TimeoutError):
        await timed_out()
    # Both an abort and the episode's own cancel: the episode's wins, nothing is sent again.
    call = asyncio.create_task(gate.call("e3", [], send))
    await asyncio.sleep(0.05)
    call.cancel()
    await gate.pause("abort_and_retry")
    gate.resume(4)
    with pytest.raises(asyncio.CancelledError):
        await call
    assert sent == [0, 3, 3, 3] and gate.counts["aborted"] == 1 and not gate.calls
