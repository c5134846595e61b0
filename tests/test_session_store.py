"""Idle expiry of per-episode state on a replica: idle sessions are closed, busy ones kept."""

from __future__ import annotations

import asyncio

import pytest
from fixture_envs import SleepyEnv

from rayrollout.data.schema import Message, Task
from rayrollout.envkit import Episode
from rayrollout.envkit.session_store import SessionNotOpen, SessionStore


class ClosingEnv(SleepyEnv):
    """Records its close, as a database or sandbox would be released."""

    closed: list[str] = []  # noqa: RUF012 - one list per test run, shared on purpose

    async def close(self) -> None:
        ClosingEnv.closed.append(self.task.task_id)


def env(task_id: str, sleep_s: float = 0.0) -> ClosingEnv:
    return ClosingEnv(
        Task(
            task_id=task_id,
            prompt=[Message(role="user", content="hi")],
            environment="sleepy",
            fields={"sleep_s": sleep_s},
        )
    )


async def test_an_idle_session_is_closed_and_then_says_it_expired():
    ClosingEnv.closed.clear()
    store = SessionStore("sleepy", idle_timeout_s=0.2)
    await store.open("idle", env("idle"))
    await store.open("used", env("used"))
    for _ in range(6):  # "used" gets a call every 0.1 s: never idle for 0.2 s
        with store.use("used") as used:
            await used.call_tool("echo", '{"text": "x"}')
        await asyncio.sleep(0.1)
    assert ClosingEnv.closed == ["idle"] and len(store) == 1 and store.expired_count == 1
    with pytest.raises(SessionNotOpen, match=r"expired after 0.2 s without a call"):
        with store.use("idle"):
            pass
    with pytest.raises(SessionNotOpen, match="replica restarted"):
        with store.use("never-opened"):
            pass
    await store.close("used")
    assert ClosingEnv.closed == ["idle", "used"] and len(store) == 0
    await asyncio.sleep(0.15)
    assert store.sweeper is not None and store.sweeper.done()  # stops when nothing is open


async def test_a_session_with_a_call_in_flight_is_never_expired():
    ClosingEnv.closed.clear()
    store = SessionStore("sleepy", idle_timeout_s=0.1)
    slow = env("slow", sleep_s=0.6)
    await store.open("slow", slow)
    with store.use("slow") as held:
        episode = Episode(task=held.task, messages=list(held.task.prompt))
        await held.verify(episode)  # six timeouts long
        assert ClosingEnv.closed == [] and len(store) == 1
    assert ClosingEnv.closed == []
    await asyncio.sleep(0.4)  # now idle: the sweep closes it
    assert ClosingEnv.closed == ["slow"] and len(store) == 0


async def test_reopening_an_expired_id_starts_a_fresh_session():
    store = SessionStore("sleepy", idle_timeout_s=0.05)
    await store.open("again", env("again"))
    await asyncio.sleep(0.2)
    assert await store.expire_idle() == 0 and store.expired_count == 1  # the sweep did it
    await store.open("again", env("again"))
    with store.use("again") as reopened:
        assert reopened.task.task_id == "again"
    await store.close("again")
