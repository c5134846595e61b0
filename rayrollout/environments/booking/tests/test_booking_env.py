"""Booking environment: per-episode state across turns, release on failure, real episodes."""

import json
from pathlib import Path

import pytest

from rayrollout import RolloutEngine
from rayrollout.data.config import EpisodeConfig, PolicyConfig
from rayrollout.data.schema import Task
from rayrollout.data.tasks import read_tasks
from rayrollout.engine.episode_frame import run_episode
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.environments.booking.env import BookingEnv
from rayrollout.envkit.sessions import InlineSession
from rayrollout.policy.client import PolicyClient

HERE = Path(__file__).resolve().parents[1]
EXAMPLES = list(read_tasks(HERE / "example_tasks.jsonl"))


def task(prompt="Book a suite for 2 nights.", **fields) -> Task:
    fields.setdefault("goal", [{"room": "suite", "nights": 2}])
    return Task(
        task_id="t",
        environment="booking",
        prompt=[{"role": "user", "content": prompt}],
        fields=fields,
    )


async def test_state_changes_turn_by_turn_within_one_episode():
    env = BookingEnv(task(inventory={"suite": {"rooms": 1, "price": 300}}))
    await env.setup()
    try:
        first = await env.call_tool("book", json.dumps({"request": "a suite for two nights"}))
        again = await env.call_tool("book", json.dumps({"request": "a suite for 2 nights"}))
        cancelled = await env.call_tool("cancel", json.dumps({"booking_id": "B1"}))
        rebooked = await env.call_tool("book", json.dumps({"request": "suite, 2 nights"}))
        rooms = json.loads((await env.call_tool("list_rooms", "{}")).content)
        bookings = json.loads((await env.call_tool("list_bookings", "{}")).content)
    finally:
        await env.close()
    assert first.content == "Booked a suite for 2 night(s): booking B1, total 600 EUR."
    assert again.is_error and "no suite is free" in again.content
    assert cancelled.content == "Cancelled booking B1."
    assert rebooked.content.startswith("Booked a suite for 2 night(s): booking B2")
    assert rooms == [{"type": "suite", "free": 0, "price_per_night": 300}]
    assert [(b["id"], b["status"]) for b in bookings] == [("B1", "cancelled"), ("B2", "active")]


@pytest.mark.parametrize(
    ("request_text", "error"),
    [
        ("a room for 2 nights", "say which room to book"),
        ("a suite please", "say for how many nights"),
        ("a suite for 99 nights", "between 1 and 30"),
    ],
)
async def test_unclear_requests_are_tool_errors_the_model_can_fix(request_text, error):
    env = BookingEnv(task())
    await env.setup()
    result = await env.call_tool("book", json.dumps({"request": request_text}))
    await env.close()
    assert result.is_error and error in result.content


def test_book_is_the_first_tool_so_a_naive_policy_can_use_it():
    assert [t["function"]["name"] for t in BookingEnv.tool_schemas()] == [
        "book",
        "cancel",
        "list_bookings",
        "list_rooms",
    ]
    assert BookingEnv.is_stateful()


async def test_the_database_is_released_when_the_episode_fails():
    before = BookingEnv.open_databases
    dead = PolicyClient(PolicyConfig(timeout_s=0.5, max_retries=0), "http://127.0.0.1:9/v1")
    spec = EpisodeSpec(task=EXAMPLES[0])
    trajectory = await run_episode(
        spec, BookingEnv, InlineSession(BookingEnv, spec.task), dead, EpisodeConfig()
    )
    await dead.close()
    assert trajectory.status in ("error", "timeout")
    assert BookingEnv.open_databases == before


def test_scripted_episodes_are_scored_on_the_final_state(tmp_path, serve_session):
    config = {
        "namespace": "booking-tests",
        "output": {"dir": str(tmp_path / "out")},
        "ray": {"serve_port": serve_session},
        "concurrency": 8,
    }
    with RolloutEngine(config) as engine:
        result = engine.collect(EXAMPLES, num_repeats=2)
    by_task = {(t.task_id, t.sample_index): t for t in result.trajectories()}
    assert len(by_task) == 2 * len(EXAMPLES)
    rewards = {task_id: t.reward for (task_id, _), t in by_task.items()}
    # One call per episode: every single booking is made and confirmed; the sold-out suite
    # is (rightly) not booked; of two rooms asked for, only the first is booked.
    assert rewards == {
        "booking-0": 1.0,
        "booking-1": 1.0,
        "booking-2": 1.0,
        "booking-3": 1.0,
        "booking-4": 0.5,
    }
    partial = by_task[("booking-4", 0)]
    assert partial.status == "ok"
    assert partial.verification["matched"] == 1
    assert partial.verification["bookings"] == [
        {"id": "B1", "type": "single", "nights": 2, "status": "active"}
    ]
