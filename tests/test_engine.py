"""The engine end to end on a local Ray: scripted policy over real HTTP, real Serve replicas."""

import pytest
import ray

from rayrollout import RolloutEngine, RunConfig

TEST_ENVS = {
    "echo": {"path": "fixture_envs:EchoEnv"},
    "faulty": {"path": "fixture_envs:FaultyEnv"},
    "counter": {"path": "fixture_envs:CounterEnv", "replicas": 2},
    "picky-counter": {"path": "fixture_envs:PickyCounterEnv"},
}


def config(tmp_path, port, **overrides) -> RunConfig:
    data = {
        "namespace": "engine-tests",
        "environments": TEST_ENVS,
        "output": {"dir": str(tmp_path / "out"), "rows_per_part": 7},
        "ray": {"serve_port": port},
        "concurrency": 16,
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return RunConfig.model_validate(data)


def echo_tasks(n, prefix="say"):
    return [
        {"task_id": f"{prefix}-{i}", "prompt": f"{prefix} {i}", "environment": "echo"}
        for i in range(n)
    ]


def test_failing_tool_and_timed_out_policy_end_as_trajectories_and_spare_the_rest(
    tmp_path, serve_session
):
    # The slow call outlasts the timeout by far, and the timeout leaves every other call room
    # on a machine whose load is in the tens: each status follows from the task, not the load.
    cfg = config(tmp_path, serve_session, policy={"timeout_s": 15.0, "max_retries": 0})
    tasks = echo_tasks(6) + [
        {"task_id": "crash", "prompt": "break it", "environment": "faulty"},
        {"task_id": "slow", "prompt": "take your time [[sleep=60]]", "environment": "echo"},
    ]
    with RolloutEngine(cfg) as engine:
        result = engine.collect(tasks)
    by_id = {t.task_id: t for t in result.trajectories()}
    assert len(by_id) == 8
    assert by_id["crash"].status == "error"
    assert "tool 'explode' failed: RuntimeError: boom" in by_id["crash"].error
    assert by_id["slow"].status == "timeout"
    assert "timed out" in by_id["slow"].error
    for i in range(6):
        ok = by_id[f"say-{i}"]
        assert (ok.status, ok.reward, ok.error) == ("ok", 1.0, None)
        assert [m.role for m in ok.messages] == ["user", "assistant", "tool", "assistant"]
        assert ok.messages[2].content == f"say {i}"
    assert result.summary["total"]["statuses"] == {"ok": 6, "error": 1, "timeout": 1}


def test_stateful_environment_keeps_each_episode_on_one_replica(tmp_path, serve_session):
    cfg = config(tmp_path, serve_session)
    tasks = [
        {"task_id": f"c{i}", "prompt": f"count {i}", "environment": "counter"} for i in range(12)
    ]
    with RolloutEngine(cfg) as engine:
        result = engine.collect(tasks, num_repeats=2)
    trajectories = result.trajectories()
    assert len(trajectories) == 24
    assert {(t.status, t.reward) for t in trajectories} == {("ok", 1.0)}
    assert {t.verification["count"] for t in trajectories} == {1}
    from ray import serve

    handle = serve.get_app_handle("engine-tests.env.counter")
    assert handle.open_sessions.remote().result() == 0  # every session was released


def test_stateful_sessions_open_with_the_first_call_and_close_with_verify(tmp_path, serve_session):
    # The session opens with the episode's first call (a tool call, or verify when the model
    # calls no tool) and closes with verify: a failing setup still reads as setup, and
    # every session is released whichever way the episode ends.
    cfg = config(tmp_path, serve_session)
    tasks = [
        {"task_id": "tool", "prompt": "count", "environment": "picky-counter"},
        {"task_id": "no-tool", "prompt": "count", "environment": "picky-counter", "tools": []},
        {"task_id": "refused", "prompt": "count", "environment": "picky-counter", "refuse": 1},
        {
            "task_id": "refused-no-tool",
            "prompt": "count",
            "environment": "picky-counter",
            "tools": [],
            "refuse": 1,
        },
    ]
    with RolloutEngine(cfg) as engine:
        by_id = {t.task_id: t for t in engine.collect(tasks).trajectories()}
    assert (by_id["tool"].status, by_id["tool"].reward) == ("ok", 1.0)
    assert by_id["tool"].verification == {"count": 1}
    assert (by_id["no-tool"].status, by_id["no-tool"].verification) == ("ok", {"count": 0})
    for task_id in ("refused", "refused-no-tool"):
        assert by_id[task_id].status == "error"
        assert by_id[task_id].error == (
            f"setting up the environment failed: ValueError: no database for task {task_id}"
        )
    from ray import serve

    handle = serve.get_app_handle("engine-tests.env.picky-counter")
    assert handle.open_sessions.remote().result() == 0


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_samples_group_by_task_and_read_back_as_a_ray_dataset(tmp_path, serve_session, fmt):
    cfg = config(tmp_path, serve_session, output={"format": fmt})
    with RolloutEngine(cfg) as engine:
        result = engine.collect(echo_tasks(5), num_repeats=3)
        assert ray.get_actor("worker:0", namespace="engine-tests") is not None
        assert ray.get_actor("engine", namespace="engine-tests") is not None
    groups = result.groups()
    assert sorted(groups) == [f"say-{i}" for i in range(5)]
    assert all([t.sample_index for t in g] == [0, 1, 2] for g in groups.values())
    assert all({t.group_id for t in g} == {task_id} for task_id, g in groups.items())
    dataset = result.dataset()
    assert dataset.count() == 15
    assert set(dataset.columns()) >= {
        "task_id",
        "sample_index",
        "messages",
        "turns",
        "reward",
        "status",
    }


def test_responses_api_gives_the_same_episodes_as_chat(tmp_path, serve_session):
    results = {}
    for api in ("chat", "responses"):
        cfg = config(tmp_path / api, serve_session, policy={"api": api})
        with RolloutEngine(cfg) as engine:
            results[api] = sorted(
                engine.collect(echo_tasks(3)).trajectories(), key=lambda t: t.task_id
            )
    for chat, responses in zip(results["chat"], results["responses"], strict=True):
        assert responses.status == "ok" and responses.reward == 1.0
        assert [m.role for m in responses.messages] == [m.role for m in chat.messages]
        assert responses.messages[-1].content == chat.messages[-1].content


def test_episode_without_final_answer_ends_at_max_turns(tmp_path, serve_session):
    cfg = config(tmp_path, serve_session, episode={"max_turns": 1})
    with RolloutEngine(cfg) as engine:
        [trajectory] = engine.collect(echo_tasks(1)).trajectories()
    assert trajectory.status == "max_turns"
    assert trajectory.metrics.turns == 1 and trajectory.metrics.tool_calls == 1


def test_unknown_environment_fails_only_its_episode(tmp_path, serve_session):
    cfg = config(tmp_path, serve_session)
    tasks = echo_tasks(2) + [{"task_id": "lost", "prompt": "hi", "environment": "nowhere"}]
    with RolloutEngine(cfg) as engine:
        by_id = {t.task_id: t for t in engine.collect(tasks).trajectories()}
    assert by_id["lost"].status == "error"
    assert "unknown environment 'nowhere'" in by_id["lost"].error
    assert by_id["say-0"].status == by_id["say-1"].status == "ok"


def test_one_engine_runs_several_collections_each_reading_back_its_own(tmp_path, serve_session):
    cfg = config(tmp_path, serve_session)
    with RolloutEngine(cfg) as engine:
        first = engine.collect(echo_tasks(3, prefix="first"))
        second = engine.collect(echo_tasks(4, prefix="second"), num_repeats=2)
    assert sorted(t.task_id for t in first.trajectories()) == [f"first-{i}" for i in range(3)]
    assert len(second.trajectories()) == 8
    assert {t.task_id.split("-")[0] for t in second.trajectories()} == {"second"}
    assert second.summary["total"]["episodes"] == 8
    assert second.dataset().count() == 8


def test_each_trajectory_carries_a_replayable_timeline(tmp_path, serve_session):
    cfg = config(tmp_path, serve_session)
    with RolloutEngine(cfg) as engine:
        [trajectory] = engine.collect(echo_tasks(1)).trajectories()
    timeline = trajectory.metrics.timeline
    assert [(e.kind, e.name) for e in timeline] == [
        ("model", ""),
        ("tool", "echo"),
        ("model", ""),
        ("verify", ""),
    ]
    starts = [e.start_s for e in timeline]
    assert starts == sorted(starts) and starts[0] >= 0
    assert all(e.seconds >= 0 and e.ok for e in timeline)
    assert timeline[-1].start_s + timeline[-1].seconds <= trajectory.metrics.seconds_total + 0.01


def test_time_before_the_start_and_in_the_writer_is_accounted(tmp_path, serve_session):
    """Two slots for eight slow episodes: the later ones wait, and say how long."""
    from ray import serve

    slow = {"scripted": {"latency_s": 0.2}}
    cfg = config(tmp_path, serve_session, namespace="queue-tests", concurrency=2, policy=slow)
    try:
        with RolloutEngine(cfg) as engine:
            result = engine.collect(echo_tasks(8, prefix="queued"))
            stats = ray.get(engine.engine.stats.remote())
    finally:
        serve.delete("queue-tests.policy")
    queued = sorted(t.metrics.seconds_queued for t in result.trajectories())
    # Each episode holds a slot for two 0.2 s model calls: the last pair waits three rounds
    # (1.2 s of model calls) more than the first pair, whose wait is only the dispatch's and
    # grows with the machine's load; so the gap is asserted, not the first wait itself.
    assert queued[-1] >= 1.0 and queued[-1] - queued[0] >= 0.8, queued
    total = result.summary["total"]
    assert total["seconds_queued"] == pytest.approx(sum(queued), rel=1e-6)
    assert result.summary["writer"]["rows"] == 8 and result.summary["writer"]["seconds"] > 0
    assert stats["mean_queued_s"] == pytest.approx(sum(queued) / 8, rel=1e-6)
    assert set(stats["time_split"]) == {"model", "tools", "verify", "other"}
    assert stats["time_split"]["model"] > 0.5  # the 0.2 s calls dominate an echo episode


def test_engine_workers_and_environment_replicas_run_with_a_tuned_collector(
    tmp_path, serve_session
):
    """Each process that plays episodes froze its start-up heap and raised the young
    threshold (``gc_tuning``); at CPython's defaults a worker spent a fifth of its CPU in
    the collector. The driver, the user's process, keeps its own settings."""
    import gc

    from rayrollout.engine.feeding import worker_name
    from rayrollout.gc_tuning import YOUNG_THRESHOLD

    def collector(actor):
        return ray.get(
            actor.__ray_call__.remote(lambda self: (gc.get_threshold()[0], gc.get_freeze_count()))
        )

    cfg = config(tmp_path, serve_session)
    tasks = [{"task_id": "c0", "prompt": "count 0", "environment": "counter"}]
    with RolloutEngine(cfg) as engine:
        assert engine.collect(tasks).trajectories()[0].status == "ok"
        workers = [
            ray.get_actor(worker_name(i), namespace=cfg.namespace)
            for i in range(cfg.workers.num_workers)
        ]
        replicas = [
            ray.get_actor(actor["name"], namespace=actor["namespace"])
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["name"].startswith("SERVE_REPLICA::engine-tests.env.counter#")
        ]
        assert len(replicas) == 2
        for actor in [engine.engine, *workers, *replicas]:
            threshold, frozen = collector(actor)
            assert threshold == YOUNG_THRESHOLD
            assert frozen > 10_000  # modules, classes, Ray's worker state
    assert gc.get_threshold()[0] != YOUNG_THRESHOLD


def test_workers_keep_serves_logger_at_warning_after_their_first_serve_hosted_call(
    tmp_path, serve_session
):
    """A worker imports Serve at its first Serve-hosted episode, and Serve's first import
    sets its logger to INFO; its router's start-up lines then reached the demo's console."""
    import logging
    import sys

    from rayrollout.engine.feeding import worker_name

    def serve_logger(actor):
        return ray.get(
            actor.__ray_call__.remote(
                lambda self: ("ray.serve" in sys.modules, logging.getLogger("ray.serve").level)
            )
        )

    cfg = config(tmp_path, serve_session)
    tasks = [
        {"task_id": f"c{i}", "prompt": f"count {i}", "environment": "counter"} for i in range(4)
    ]
    with RolloutEngine(cfg) as engine:
        assert {t.status for t in engine.collect(tasks).trajectories()} == {"ok"}
        levels = [
            serve_logger(ray.get_actor(worker_name(i), namespace=cfg.namespace))
            for i in range(cfg.workers.num_workers)
        ]
    played = [level for imported, level in levels if imported]
    assert played, levels  # at least one worker called the Serve-hosted environment
    assert played == [logging.WARNING] * len(played), levels
