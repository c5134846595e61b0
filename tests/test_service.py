"""The rollout API over HTTP, as a trainer without Ray reaches it: the light client against
the service `rayrollout up` starts beside a detached engine (real Ray, real aiohttp on
127.0.0.1, the scripted policy standing in for the model's judgement).

One engine for the module, with a small per-batch bound (``max_buffered_rows``), so the
backpressure test sees it and the other tests run past it only by acknowledging. Every test
counts rows by ``(task_id, sample_index)``: exactly once is what is asserted.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from rayrollout import RunConfig
from rayrollout.api.cluster import down, service_url, start_detached
from rayrollout.auth import read_token_file
from rayrollout.client import (
    AsyncRolloutClient,
    BadRequestError,
    BatchConflictError,
    RolloutClient,
    UnauthorizedError,
)
from rayrollout.engine.secret_env import route_token_path

NAMESPACE = "service-tests"
WINDOW = 6  # the module's max_buffered_rows


@pytest.fixture(scope="module")
def service(tmp_path_factory, serve_session) -> Iterator[dict[str, Any]]:
    """A detached engine and its HTTP service, as `rayrollout up` starts them."""
    config = RunConfig.model_validate(
        {
            "namespace": NAMESPACE,
            "environments": {"scheduled": {"path": "fixture_envs:ScheduledRewardEnv"}},
            "environment": "scheduled",
            "workers": {"num_workers": 1},
            "concurrency": 16,
            "output": {"dir": str(tmp_path_factory.mktemp("service") / "out")},
            "ray": {"serve_port": serve_session},
            "service": {"port": 0, "max_buffered_rows": WINDOW},
        }
    )
    start_detached(config)
    try:
        url = service_url(NAMESPACE)
        token = read_token_file(route_token_path(NAMESPACE))
        yield {"url": url, "token": token, "config": config}
    finally:
        down(NAMESPACE)


@pytest.fixture
def client(service) -> RolloutClient:
    return RolloutClient(service["url"], service["token"], retries=3, backoff_s=0.1)


def rows(prefix: str, count: int, rewards: list[float] | None = None) -> list[dict[str, Any]]:
    return [
        {"task_id": f"{prefix}-{i}", "prompt": f"note {prefix} {i}", "rewards": rewards or [1.0]}
        for i in range(count)
    ]


def keys(items: list[Any]) -> Counter[tuple[str, int]]:
    return Counter(item.trajectory.key for item in items)


def expected(prefix: str, tasks: int, n: int) -> Counter[tuple[str, int]]:
    return Counter((f"{prefix}-{i}", s) for i in range(tasks) for s in range(n))


def test_the_service_is_found_by_name_on_loopback(service):
    import ray

    from rayrollout.api.service.service_actor import SERVICE_NAME

    assert service["url"].startswith("http://127.0.0.1:")
    described = ray.get(ray.get_actor(SERVICE_NAME, namespace=NAMESPACE).describe.remote())
    assert described["url"] == service["url"] and described["host"] == "127.0.0.1"
    assert described["limits"]["max_buffered_rows"] == WINDOW


def test_a_batch_of_n_samples_streams_every_task_sample_exactly_once(client):
    batch = client.submit(rows("s", 4, [1.0, 0.0, 0.5]), n=3)
    assert batch.created and (batch.tasks, batch.samples) == (4, 12)
    items = list(client.stream(batch.batch_id))
    version = client.stats().policy.version

    assert keys(items) == expected("s", 4, 3)
    assert [item.cursor for item in items] == list(range(12))  # in cursor order, no gap
    for item in items:
        row = item.trajectory
        assert row.status == "ok" and row.group_id == row.task_id
        assert len(row.turns) == 2  # the tool call, then the answer
        assert {turn.policy_version for turn in row.turns} == {version}
        assert json.loads(row.task_fields)["rewards"] == [1.0, 0.0, 0.5]
    for task in range(4):  # each group got the schedule's rewards, one per sample
        group = [i.trajectory.reward for i in items if i.trajectory.task_id == f"s-{task}"]
        assert sorted(group) == [0.0, 0.5, 1.0]
    final = client.batch(batch.batch_id)
    assert final.done and final.acknowledged == 12 and final.running == 0


async def test_the_async_client_submits_streams_and_waits(service):
    client = AsyncRolloutClient(service["url"], service["token"])
    first = await client.submit(rows("a", 2), n=2)
    streamed = [item async for item in client.stream(first.batch_id)]
    whole = await client.generate(rows("aw", 3), n=2)
    assert keys(streamed) == expected("a", 2, 2)
    assert Counter(row.key for row in whole) == expected("aw", 3, 2)
    assert (await client.info()).namespace == NAMESPACE


def test_without_the_token_every_route_answers_401(service):
    for token in (None, "not-the-token"):
        anonymous = RolloutClient(service["url"], token)
        with pytest.raises(UnauthorizedError, match="bearer token"):
            anonymous.submit(rows("x", 1))
        with pytest.raises(UnauthorizedError):
            anonymous.stats()
        with pytest.raises(UnauthorizedError):
            anonymous.run({"responses_create_params": {"input": "hi"}})


def test_a_bad_row_is_a_400_naming_the_row_and_field_and_other_rows_are_unaffected(client):
    running = client.submit(rows("ok", 2), n=2)  # a batch already on its way
    bad = [*rows("b", 3)]
    bad[1] = {"task_id": "b-1", "prompt": "   "}  # no text
    bad[2] = {"task_id": "b-2", "prompt": "hi", "environment": "nowhere"}
    with pytest.raises(BadRequestError, match=r"tasks\[1\] \(task_id 'b-1'\), field 'prompt'") as e:
        client.submit(bad, n=2)
    assert [(r["row"], r["field"]) for r in e.value.errors] == [(1, "prompt"), (2, "environment")]
    assert "unknown environment 'nowhere'" in e.value.errors[1]["message"]
    with pytest.raises(BadRequestError, match="field 'n'"):
        client.submit(rows("b", 1), n=0)

    kept = client.submit(bad, n=2, skip_invalid=True)
    assert (kept.tasks, kept.samples) == (1, 2) and [r.row for r in kept.rejected] == [1, 2]
    assert keys(list(client.stream(kept.batch_id))) == expected("b", 1, 2)
    assert keys(list(client.stream(running.batch_id))) == expected("ok", 2, 2)


def test_a_retried_submit_with_the_same_batch_id_adds_nothing(client):
    before = client.stats().episodes_done
    tasks = rows("r", 2)
    first = client.submit(tasks, n=2, batch_id="retry-me")
    again = client.submit(tasks, n=2, batch_id="retry-me")  # the answer was lost, say
    assert first.created and not again.created and again.batch_id == "retry-me"
    assert keys(list(client.stream("retry-me", ack_every=1000))) == expected("r", 2, 2)
    assert client.batch("retry-me").acknowledged == 4  # acknowledged at the end, settled
    assert not client.submit(tasks, n=2, batch_id="retry-me").created  # also once finished
    with pytest.raises(BatchConflictError, match="other tasks"):
        client.submit(rows("other", 1), n=2, batch_id="retry-me")
    time.sleep(0.5)
    assert client.stats().episodes_done - before == 4


class DroppingProxy:
    """A TCP proxy to the service that cuts each of the first ``drops`` stream connections
    after ``after`` bytes of the answer: a connection lost in the middle of a batch."""

    def __init__(self, url: str, drops: int, after: int) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.drops, self.after, self.dropped = drops, after, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        request = client.recv(65536)
        upstream.sendall(request)
        threading.Thread(target=self._forward, args=(client, upstream), daemon=True).start()
        cut = b"/trajectories" in request.split(b"\r\n", 1)[0] and self.dropped < self.drops
        if cut:
            self.dropped += 1
        sent = 0
        try:
            while data := upstream.recv(4096):
                if cut and sent + len(data) > self.after:
                    client.sendall(data[: self.after - sent])
                    break
                client.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for end in (client, upstream):  # shutdown first: a close alone sends no FIN
                try:  # while the other thread is still blocked reading the socket
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    @staticmethod
    def _forward(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.server.close()


def test_a_dropped_stream_is_reconnected_from_its_cursor_losing_and_repeating_nothing(service):
    direct = RolloutClient(service["url"], service["token"])
    batch = direct.submit(rows("d", 5), n=2)
    proxy = DroppingProxy(service["url"], drops=3, after=2500)  # mid-line, a few rows in
    try:
        through = RolloutClient(proxy.url, service["token"], retries=5, backoff_s=0.05)
        items = list(through.stream(batch.batch_id, ack_every=1))
    finally:
        proxy.close()
    assert proxy.dropped == 3
    assert keys(items) == expected("d", 5, 2)
    assert [item.cursor for item in items] == list(range(10))


def test_a_stream_resumed_by_a_new_client_from_a_saved_cursor_gets_the_rest(service, client):
    batch = client.submit(rows("c", 3), n=2)
    first = []
    for item in client.stream(batch.batch_id):  # this trainer stops after 2 rows
        first.append(item)
        if len(first) == 2:
            break
    cursor = first[-1].cursor + 1  # what it saved
    again = RolloutClient(service["url"], service["token"])  # the restarted process
    rest = list(again.stream(batch.batch_id, cursor=cursor))
    assert keys(first + rest) == expected("c", 3, 2)
    with pytest.raises(BatchConflictError, match="already acknowledged"):
        list(again.stream(batch.batch_id, cursor=0))
    with pytest.raises(BatchConflictError, match="past its 6 finished rows"):
        list(again.stream(batch.batch_id, cursor=7))


def test_a_consumer_that_does_not_acknowledge_stalls_its_batch_at_the_bound(client):
    batch = client.submit(rows("w", 5), n=2)  # 10 samples, bound 6
    connection, response = client.transport.open_stream(
        f"/v1/batches/{batch.batch_id}/trajectories?cursor=0", 30
    )
    try:
        deadline = time.monotonic() + 60
        while (status_now := client.batch(batch.batch_id)).finished < WINDOW:
            assert time.monotonic() < deadline, status_now
            time.sleep(0.2)
        time.sleep(1.0)  # room for more, were the bound not kept
        held = client.batch(batch.batch_id)
        assert (held.finished, held.running, held.acknowledged) == (WINDOW, 0, 0)
    finally:
        connection.close()
    assert keys(list(client.stream(batch.batch_id))) == expected("w", 5, 2)


def test_pause_holds_the_batch_and_new_weights_reach_the_next_rows(client):
    version = client.stats().policy.version
    assert client.pause("wait").calls_in_flight == 0
    batch = client.submit(rows("p", 2), n=1)
    time.sleep(1.5)
    held = client.batch(batch.batch_id)
    assert held.finished == 0 and client.stats().policy.paused
    assert client.update_weights().version == version + 1
    assert client.resume().version == version + 1
    items = list(client.stream(batch.batch_id))
    assert keys(items) == expected("p", 2, 1)
    assert {t.policy_version for i in items for t in i.trajectory.turns} == {version + 1}
    with pytest.raises(BadRequestError, match="mode"):
        client.pause("later")


def test_nemo_gym_run_answers_the_verified_response_and_reward(client):
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "note ng"}]},
        "rewards": [0.25],
        "task_id": "ng-1",
    }
    answer = client.run(row)
    assert answer["reward"] == 0.25 and answer["rewards"] == [0.25]
    assert answer["responses_create_params"]["input"][0]["content"] == "note ng"
    kinds = [item["type"] for item in answer["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"]
    assert not any(key.startswith("_ng_") for key in answer)
    with pytest.raises(BadRequestError, match="responses_create_params"):
        client.run({"responses_create_params": {"input": []}})


def test_nemo_gym_routes_go_without_a_token_only_where_the_config_says(service):
    """NeMo Gym's collector sends no token: /run and /aggregate_metrics may be opened, and
    only they (a second service on the module's engine, so nothing else is started)."""
    import ray
    from pydantic import SecretStr

    from rayrollout.api.service.service_actor import ServiceActor

    settings = {"nemo_gym_run_without_token": True, "port": 0}
    config = service["config"].model_copy(
        update={"service": service["config"].service.model_copy(update=settings)}
    )
    actor = ServiceActor.options(name="service-open", namespace=NAMESPACE).remote(
        config, SecretStr(service["token"])
    )
    try:
        anonymous = RolloutClient(ray.get(actor.start.remote()), None)
        answer = anonymous.run({"responses_create_params": {"input": "note open"}, "rewards": [1]})
        figures = anonymous.transport.request(
            "POST", "/aggregate_metrics", {"verify_responses": [answer, {**answer, "reward": 0}]}
        )
        with pytest.raises(UnauthorizedError):
            anonymous.stats()
        with pytest.raises(BadRequestError, match="verify_responses"):
            anonymous.transport.request("POST", "/aggregate_metrics", {"verify_responses": 3})
    finally:
        ray.get(actor.close.remote())
        ray.kill(actor)
    assert answer["reward"] == 1.0
    assert figures["agent_metrics"]["mean/reward"] == 0.5
    assert figures["agent_metrics"]["num_rollouts"] == 2


def test_a_submit_past_max_open_batches_is_a_429_that_the_client_raises_and_nothing_starts(
    service,
):
    """A second service on the module's engine holding one open batch at most: a batch
    nobody reads keeps it full; the next submit answers 429 (``ServiceBusyError``, not
    retried); once the first batch is read to its end, the same submit is accepted anew."""
    import ray
    from pydantic import SecretStr

    from rayrollout.api.service.service_actor import ServiceActor
    from rayrollout.client import ServiceBusyError

    settings = {"max_open_batches": 1, "port": 0}
    config = service["config"].model_copy(
        update={"service": service["config"].service.model_copy(update=settings)}
    )
    actor = ServiceActor.options(name="service-busy", namespace=NAMESPACE).remote(
        config, SecretStr(service["token"])
    )
    try:
        busy = RolloutClient(ray.get(actor.start.remote()), service["token"], retries=3)
        held = busy.submit(rows("full", 2), n=2)  # open until its rows are read
        with pytest.raises(ServiceBusyError, match="max_open_batches=1") as refused:
            busy.submit(rows("next", 1), n=2, batch_id="after-429")
        assert refused.value.status == 429
        assert keys(list(busy.stream(held.batch_id))) == expected("full", 2, 2)
        accepted = busy.submit(rows("next", 1), n=2, batch_id="after-429")
        assert accepted.created  # the 429 had started nothing under this id
        assert keys(list(busy.stream("after-429"))) == expected("next", 1, 2)
    finally:
        ray.get(actor.close.remote())
        ray.kill(actor)


def test_the_raw_protocol_names_cursors_and_ends_with_an_end_line(service, client):
    batch = client.submit(rows("raw", 1), n=2)
    host, port = service["url"].removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request(
        "GET",
        f"/v1/batches/{batch.batch_id}/trajectories",
        headers={"Authorization": f"Bearer {service['token']}"},
    )
    response = connection.getresponse()
    lines = [json.loads(line) for line in response.read().splitlines() if line.strip()]
    connection.close()
    assert response.headers["Content-Type"] == "application/x-ndjson"
    assert lines[0]["batch"]["samples"] == 2
    assert [line["cursor"] for line in lines[1:-1]] == [0, 1]
    assert lines[-1] == {"end": {"finished": 2, "samples": 2, "error": None, "engine_gone": False}}


def test_the_engine_gone_reads_as_engine_gone(tmp_path):
    """The service of a namespace whose engine died: a stand-in engine actor, killed (a
    second real engine would cost the suite half a minute to show the same)."""
    import ray
    from pydantic import SecretStr

    from rayrollout.api.cluster import start_service
    from rayrollout.client import EngineGoneError

    @ray.remote(num_cpus=0)
    class StandIn:  # the engine's names, none of its work: it is killed before any call
        def ready(self) -> bool:
            return True

        def stats(self) -> None: ...

        def claim_samples(self, ends: dict) -> None: ...

        def stream(self, specs: list, write: bool):  # a generator, as the engine's
            yield []

    namespace = "service-tests-gone"
    config = RunConfig.model_validate(
        {
            "namespace": namespace,
            "environments": {"scheduled": {"path": "fixture_envs:ScheduledRewardEnv"}},
            "environment": "scheduled",
            "output": {"dir": str(tmp_path / "out")},
            "service": {"port": 0},
        }
    )
    engine = StandIn.options(name="engine", namespace=namespace).remote()
    ray.get(engine.ready.remote())
    try:
        url = start_service(config, SecretStr("gone-token"))
        client = RolloutClient(url, "gone-token", retries=1, backoff_s=0.01, restart_wait_s=0)
        ray.kill(engine)
        with pytest.raises(EngineGoneError, match="engine actor is gone"):
            client.stats()
        with pytest.raises(EngineGoneError, match="engine actor is gone.*up --resume"):
            list(client.stream(client.submit(rows("g", 1)).batch_id))
        # A client that waits for a new engine gives up after restart_wait_s, saying so.
        waiting = RolloutClient(url, "gone-token", retries=1, backoff_s=0.01, restart_wait_s=1)
        with pytest.raises(EngineGoneError, match="no engine came back in restart_wait_s=1"):
            list(waiting.stream(waiting.submit(rows("g2", 1)).batch_id))
    finally:
        down(namespace)
    with pytest.raises(EngineGoneError, match="no rollout service answered"):
        RolloutClient(url, "gone-token", retries=1, backoff_s=0.01).stats()
    assert asyncio.iscoroutinefunction(AsyncRolloutClient.stats)
