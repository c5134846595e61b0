"""Stateless calls of many episodes share Serve handle calls, and each still gets its own
answer or its own error."""

from __future__ import annotations

import asyncio

import pytest

from rayrollout.auth import RouteAuth, new_token
from rayrollout.data.schema import Message, Task
from rayrollout.envkit import Episode
from rayrollout.envkit.serve_batching import BatchingHandle
from rayrollout.envkit.server import environment_app

APP = "batching-tests.env.faulty"


@pytest.fixture(scope="module")
def faulty_handle(serve_session):
    from ray import serve

    serve.run(
        environment_app("fixture_envs:FaultyEnv", auth=RouteAuth.bearer(new_token())),
        name=APP,
        route_prefix="/batching-tests/faulty",
    )
    yield serve.get_app_handle(APP).options(_by_reference=False)
    serve.delete(APP)


def episode(i: int) -> Episode:
    task = Task(
        task_id=f"t{i}", environment="faulty", prompt=[Message(role="user", content=f"go {i}")]
    )
    return Episode(task=task, messages=[*task.prompt, Message(role="assistant", content="ok")])


async def test_concurrent_calls_share_batches_and_keep_their_own_outcomes(faulty_handle):
    batcher = BatchingHandle(faulty_handle, max_in_flight=2)
    episodes = [episode(i) for i in range(40)]
    verdicts = [batcher.call("verify", None, e) for e in episodes]
    bad = batcher.call("call_tool", None, episodes[0].task, "explode", '{"text": "x"}')
    *results, failure = await asyncio.gather(*verdicts, bad, return_exceptions=True)
    assert [r.reward for r in results] == [1.0] * 40
    assert isinstance(failure, RuntimeError) and "boom on 'x'" in str(failure)
    assert batcher.calls == 41
    assert batcher.batches <= 4, batcher.batches  # 41 calls made in one turn of the loop
    assert batcher.in_flight == 0 and not batcher.waiting


async def test_a_lone_call_goes_out_at_once_and_methods_outside_the_protocol_are_refused(
    faulty_handle,
):
    batcher = BatchingHandle(faulty_handle)
    verdict = await batcher.call("verify", None, episode(1))
    assert verdict.reward == 1.0 and batcher.batches == 1
    with pytest.raises(ValueError, match="'open' cannot be batched"):
        await batcher.call("open", "episode-1", episode(1).task)
