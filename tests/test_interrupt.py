"""Pause modes 'interrupt' and 'continue' through the gate and the token-ids client, against
a real HTTP server that answers ``/v1/completions`` as vLLM does around a weight update: one
token at a time, a paused server stopping every request at once (``finish_reason: abort``,
the tokens so far returned) and holding new ones until it resumes. Its next token is a
function of the whole prefix and the weights' version, so a continuation shows whether it
went on from the kept tokens under the new weights. Also: the rows, ``show`` and the report
carry each token's version, and the policy kinds that cannot interrupt refuse it by name.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from netutil import served_routes
from trajectories import greeting

from rayrollout.data.config import PolicyConfig, RunConfig
from rayrollout.data.schema import Message, Turn, version_spans
from rayrollout.policy.call import PolicyRequest
from rayrollout.policy.client import PolicyClient
from rayrollout.policy.gate import PolicyGate, StaleEpisode
from rayrollout.policy.tokens import DeltaRenderer


def next_token(prefix: list[int], version: int) -> int:
    return (sum(prefix) * 31 + len(prefix) + version * 7919) % 5000 + 10


def logprob(token: int, version: int) -> float:
    return -((token % 97) / 97.0) - 0.001 * version


class FakeVllm:
    """/v1/completions one token per ``step_s``; /pause (abort) and /resume as vLLM's."""

    def __init__(self, step_s: float = 0.005) -> None:
        self.version = 0
        self.step_s = step_s
        self.running = asyncio.Event()
        self.running.set()
        self.abort = asyncio.Event()
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        prompt, out = list(body["prompt"]), []
        self.in_flight += 1
        finish = "length"
        try:
            while not self.running.is_set():  # paused: queued until resume, or stopped
                if self.abort.is_set():
                    return self.answer(out, "abort", prompt)
                await asyncio.sleep(0.001)
            for _ in range(body["max_tokens"]):
                if self.abort.is_set():
                    finish = "abort"
                    break
                await asyncio.sleep(self.step_s)
                out.append(next_token(prompt + out, self.version))
        finally:
            self.in_flight -= 1
        return self.answer(out, finish, prompt)

    def answer(self, out: list[int], finish: str, prompt: list[int]) -> web.Response:
        choice = {
            "index": 0,
            "text": "".join(f" w{t}" for t in out),
            "token_ids": out,
            "logprobs": {"token_logprobs": [logprob(t, self.version) for t in out]},
            "finish_reason": finish,
        }
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out)}
        return web.json_response({"choices": [choice], "usage": usage})

    async def pause(self) -> None:
        self.running.clear()
        self.abort.set()
        while self.in_flight:
            await asyncio.sleep(0.001)
        self.abort.clear()

    def resume(self) -> None:
        self.running.set()


async def char_template(body: dict[str, Any]) -> list[int]:
    return [ord(c) for m in body["messages"] for c in f"<{m['role']}>{m.get('content') or ''}"]


@pytest.fixture
async def served():
    server = FakeVllm()
    async with served_routes({"/v1/completions": server.completions}) as base_url:
        yield server, base_url


def token_client(url: str, gate: PolicyGate, max_tokens: int = 200) -> PolicyClient:
    config = PolicyConfig(
        kind="openai", model="m", prompt_mode="token_ids", tokenizer="none", max_tokens=max_tokens
    )
    client = PolicyClient(config, url, gate=gate)
    client._delta_renderer = DeltaRenderer(char_template)
    return client


def greedy(prompt: list[int], spans: list[tuple[int, int]]) -> list[int]:
    """The tokens the fake model gives: ``spans`` of (version, how many)."""
    out: list[int] = []
    for version, count in spans:
        for _ in range(count):
            out.append(next_token(prompt + out, version))
    return out


async def update_mid_call(
    server: FakeVllm, url: str, gate: PolicyGate, mode: str, calls: int = 3
) -> list[Any]:
    """``calls`` calls in flight, paused in ``mode`` after some tokens, the weights moved to
    version 1, resumed; each call's reply."""
    client = token_client(url, gate)
    prompts = [[Message(role="user", content=f"task {i}")] for i in range(calls)]
    tasks = [
        asyncio.create_task(client.complete(PolicyRequest(p, session_id=f"e{i}")))
        for i, p in enumerate(prompts)
    ]
    await asyncio.sleep(0.25)  # tokens generated under version 0
    assert await gate.pause(mode) == calls
    await server.pause()  # the backend's pause: vLLM aborts every request in flight
    if mode == "interrupt":
        assert await gate.settle(5)
    server.version = 1
    server.resume()
    gate.resume(1)
    replies = await asyncio.gather(*tasks)
    await client.close()
    return list(replies)


@pytest.mark.parametrize("mode", ["interrupt", "continue"])
async def test_a_call_cut_by_an_update_keeps_its_tokens_and_goes_on_under_the_new_weights(
    served, mode
):
    server, url = served
    gate = PolicyGate()
    replies = await update_mid_call(server, url, gate, mode)
    prompts = [b["prompt"] for b in server.bodies if len(b["prompt"]) < 20]
    assert len(replies) == 3 and len(prompts) == 3  # no call lost or sent twice from scratch
    for reply in replies:
        turn = reply.turn
        prompt = turn.prompt_token_ids
        cut = turn.token_versions.index(1)
        assert 0 < cut < 200 and len(turn.completion_token_ids) == 200
        # Old weights up to the cut, the new ones after: each token what that version gives
        # for its prefix, the kept ones not sampled again.
        assert turn.completion_token_ids == greedy(prompt, [(0, cut), (1, 200 - cut)])
        assert turn.token_versions == [0] * cut + [1] * (200 - cut)
        assert version_spans(turn.token_versions) == [(0, 0, cut - 1), (1, cut, 199)]
        expected = [
            logprob(t, v)
            for t, v in zip(turn.completion_token_ids, turn.token_versions, strict=True)
        ]
        assert turn.logprobs == expected
        assert turn.policy_version == 0 and turn.finish_reason == "length"
        assert reply.message.content == "".join(f" w{t}" for t in turn.completion_token_ids)
        # The continuation went out with the prompt + kept ids and what was left to generate.
        sent = next(
            b for b in server.bodies if b["prompt"] == prompt + turn.completion_token_ids[:cut]
        )
        assert sent["max_tokens"] == 200 - cut
    assert gate.counts["interrupted"] == 3 and gate.counts["discarded_tokens"] == 0
    assert gate.counts["kept_tokens"] == sum(r.turn.token_versions.count(0) for r in replies)


async def test_interrupt_pause_returns_with_every_call_stopped_and_its_tokens_kept(served):
    """At settle() nothing generates: the server holds none, and the tokens made so far are
    what the finished turns hold under the old version, byte for byte."""
    server, url = served
    gate = PolicyGate()
    client = token_client(url, gate)
    task = asyncio.create_task(client.complete(PolicyRequest([Message(role="user", content="x")])))
    await asyncio.sleep(0.2)
    await gate.pause("interrupt")
    await server.pause()
    assert await gate.settle(5)
    assert server.in_flight == 0 and not gate.calls and gate.counts["interrupted"] == 1
    kept = gate.counts["kept_tokens"]
    await asyncio.sleep(0.1)  # nothing moves while paused
    assert len(server.bodies) == 1 and gate.counts["kept_tokens"] == kept
    server.version = 1
    server.resume()
    gate.resume(1)
    turn = (await task).turn
    assert turn.token_versions.count(0) == kept
    await client.close()


async def test_a_call_that_reaches_the_paused_server_late_is_stopped_again_and_sent_fresh(
    served,
):
    """A call sent just before the gate closed can reach the server after it paused: it
    waits there, settle() says so, the server is told to stop again, and the call (no token
    yet) goes out again after resume, every token under the new version."""
    server, url = served
    gate = PolicyGate()
    client = token_client(url, gate, max_tokens=20)
    await server.pause()  # the server paused before the call arrives
    task = asyncio.create_task(client.complete(PolicyRequest([Message(role="user", content="x")])))
    await asyncio.sleep(0.05)
    assert await gate.pause("interrupt") == 1
    assert not await gate.settle(0.2)  # it waits at the server
    await server.pause()  # stopped again: back with no token
    assert await gate.settle(5) and gate.counts["interrupted"] == 0
    server.version = 1
    server.resume()
    gate.resume(1)
    turn = (await task).turn
    assert turn.token_versions == [1] * 20 and turn.policy_version == 1
    assert turn.completion_token_ids == greedy(turn.prompt_token_ids, [(1, 20)])
    await client.close()


async def test_a_continuation_past_max_staleness_restarts_the_episode(served):
    server, url = served
    gate = PolicyGate(max_staleness=0)
    client = token_client(url, gate)
    task = asyncio.create_task(
        client.complete(PolicyRequest([Message(role="user", content="x")], session_id="e1"))
    )
    await asyncio.sleep(0.1)
    await gate.pause("interrupt")
    await server.pause()
    assert await gate.settle(5)
    server.resume()
    gate.resume(1)
    with pytest.raises(StaleEpisode, match="moved from 0 to 1"):
        await task
    assert gate.take_stale("e1")
    await client.close()


def test_rows_carry_token_versions_and_old_rows_read_as_the_calls_version(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayrollout import read_trajectories, trajectory_arrow_schema

    turn = Turn(completion_token_ids=[5, 6, 7], logprobs=[-1.0] * 3, policy_version=2)
    assert turn.token_versions == [2, 2, 2]  # a turn no gate stamped: one version
    cut = Turn(completion_token_ids=[5, 6, 7], logprobs=[-1.0] * 3, token_versions=[2, 3, 3])
    trajectory = greeting(turns=[turn, cut])
    row = trajectory.to_row()
    table = pa.Table.from_pylist([row], schema=trajectory_arrow_schema())
    assert table.schema.field("turns").type.value_type.field("token_versions").type == (
        pa.list_(pa.int64())
    )
    (tmp_path / "new").mkdir()
    pq.write_table(table, tmp_path / "new" / "part-00000.parquet")
    back = next(iter(read_trajectories(tmp_path / "new")))
    assert [t.token_versions for t in back.turns] == [[2, 2, 2], [2, 3, 3]]
    # A part written before the field: its turns read with the call's version on every token.
    old = json.loads(json.dumps(row, default=str))
    for t in old["turns"]:
        del t["token_versions"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "part-00000.jsonl").write_text(json.dumps(old) + "\n")
    back = next(iter(read_trajectories(tmp_path / "old")))
    assert [t.token_versions for t in back.turns] == [[2, 2, 2], [0, 0, 0]]


def test_show_prints_each_turns_version_spans():
    from rich.console import Console

    from rayrollout.cli.show import render_trajectory

    trajectory = greeting(
        turns=[Turn(completion_token_ids=[1] * 6, token_versions=[3, 3, 4, 4, 4, 4])]
    )
    console = Console(record=True, width=200)
    render_trajectory(trajectory, console)
    assert "3 (0-1), 4 (2-5)" in console.export_text()


def run_config(kind: str, mode: str = "interrupt", **policy: Any) -> RunConfig:
    return RunConfig.model_validate(
        {
            "policy": {"kind": kind, "model": "m", **policy},
            "training": {"pause_mode": mode},
        }
    )


def test_a_kind_that_cannot_interrupt_refuses_the_mode_by_name():
    from rayrollout.api.preflight import check_policy_kind
    from rayrollout.data.config import ConfigError

    for kind in ("scripted", "openai"):
        with pytest.raises(ConfigError, match=f"policy kind '{kind}' cannot interrupt"):
            check_policy_kind(run_config(kind))
    with pytest.raises(ConfigError, match="prompt_mode: token_ids"):
        check_policy_kind(run_config("vllm", prompt_mode="messages", vllm_config="x.yaml"))
    assert check_policy_kind(run_config("vllm", vllm_config="x.yaml")).kind.name == "vllm"


def test_a_kinds_keys_then_the_pause_mode_then_the_kinds_checks_are_refused_in_that_order():
    """The policy section's first error, as the planner's ``check_policy_kind`` and
    ``RolloutEngine`` say it: a wrong key of the kind, then a pause mode the kind cannot
    take, then the kind's own checks across the section."""
    from rayrollout import RolloutEngine
    from rayrollout.api.preflight import check_policy_kind
    from rayrollout.data.config import ConfigError

    both = {"base_url": "http://127.0.0.1:1/v1", "vllm_config": "x.yaml"}  # a vLLM check
    cases = [
        (run_config("vllm", **both, bogus=1), r"policy\.bogus: not a setting"),
        (run_config("vllm", **both), "pause_mode 'interrupt' continues a stopped call"),
        (run_config("vllm", "wait", **both), "not both"),
    ]
    for config, first in cases:
        for check in (check_policy_kind, RolloutEngine):
            with pytest.raises(ConfigError, match=first):
                check(config)


async def test_continue_on_vllm_chat_calls_is_refused_by_name_where_the_cut_is_unknown():
    """vLLM's chat path (prompt_mode 'messages') finishes a call under the new weights with
    no position of the cut, so 'continue' is refused there, in the config and at pause();
    token-ids mode, and kinds whose server takes no weights from the engine, keep it."""
    from rayrollout.api.preflight import check_policy_kind
    from rayrollout.data.config import ConfigError
    from rayrollout.engine.weights import WeightSync

    chat = run_config("vllm", "continue", prompt_mode="messages", vllm_config="x.yaml")
    with pytest.raises(ConfigError, match="pause_mode 'continue'.*prompt_mode: token_ids"):
        check_policy_kind(chat)
    for allowed in (
        run_config("vllm", "continue", vllm_config="x.yaml"),
        run_config("vllm", "continue", prompt_mode="token_ids", vllm_config="x.yaml"),
        run_config("scripted", "continue"),
        run_config("openai", "continue", base_url="http://127.0.0.1:1/v1"),
    ):
        check_policy_kind(allowed)

    class Backend:
        paused: list[str] = []

        async def pause(self, mode: str) -> None:
            self.paused.append(mode)

        async def resume(self) -> None:
            return None

    sync = WeightSync(chat, "http://127.0.0.1:1/v1", [], None)  # no worker, no server
    sync.backend = Backend()
    with pytest.raises(ValueError, match="pause mode 'continue' refused.*no position of the cut"):
        await sync.pause("continue")
    assert Backend.paused == []  # refused before anything paused


async def test_a_constrained_call_cannot_resume_its_constraint_and_is_made_again(served):
    """tool_choice 'required' sends a structural tag the server enforces from the first
    token: a stopped call goes out again from its start, its kept tokens counted as
    discarded, and every token of the answer is the new version's."""
    server, url = served
    gate = PolicyGate()
    client = token_client(url, gate, max_tokens=60)
    client.config.tool_choice = "required"
    client.config.model_logprobs = "off"  # this fake server has no prompt_logprobs
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    task = asyncio.create_task(
        client.complete(PolicyRequest([Message(role="user", content="x")], tools=tools))
    )
    await asyncio.sleep(0.1)
    await gate.pause("interrupt")
    await server.pause()
    assert await gate.settle(5)
    kept = gate.counts["kept_tokens"]
    server.version = 1
    server.resume()
    gate.resume(1)
    turn = (await task).turn
    assert kept > 0 and gate.counts["discarded_tokens"] == kept
    assert turn.token_versions == [1] * 60
    assert turn.completion_token_ids == greedy(turn.prompt_token_ids, [(1, 60)])
    assert [len(b["prompt"]) for b in server.bodies] == [len(turn.prompt_token_ids)] * 2
    await client.close()
