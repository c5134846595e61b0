"""The training-loop interface as a training framework drives it: from its own Ray actor.

A ``Trainer`` actor finds the engine that ``up`` started (detached, named ``engine`` in the
namespace) with ``ray.get_actor``, calls ``generate`` step after step, and updates the
policy's weights between steps and while episodes are in flight. The policy is the scripted
one (a test double for the model's judgement: a new version changes nothing but what the
turns record); ``ScheduledRewardEnv`` gives each task's samples known rewards.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import ray
from old_parts import new_row, write_before_and_after

from rayrollout import RunConfig, Trajectory, read_trajectories
from rayrollout.api.cluster import down, start_detached
from rayrollout.data.schema import Task, Turn
from rayrollout.engine.groups import Group, generate_groups

ROOT = Path(__file__).resolve().parents[1]
SLEEP_S = 3.0  # every model call of an in-flight test episode takes this long


@ray.remote(num_cpus=0)
class Trainer:
    """What a training framework's trainer does: find the engine by name and drive it."""

    def __init__(self, namespace: str) -> None:
        self.engine = ray.get_actor("engine", namespace=namespace)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return ray.get(getattr(self.engine, method).remote(*args, **kwargs))

    def steps(self, tasks: list[dict], n: int, steps: int) -> list[Any]:
        """generate -> (train) -> update_weights, ``steps`` times."""
        results = []
        for _ in range(steps):
            results.append(ray.get(self.engine.generate.remote(tasks, n)))
            ray.get(self.engine.update_weights.remote())
        return results

    def update_while_in_flight(self, tasks: list[dict], n: int, mode: str) -> dict[str, Any]:
        """Start a batch, and once every episode has a model call in flight: pause, update
        the weights, resume; then collect the batch."""
        batch = self.engine.generate.remote(tasks, n)
        deadline = time.monotonic() + 60
        while self.call("stats")["policy_calls"].get("in_flight", 0) < len(tasks) * n:
            assert time.monotonic() < deadline, "episodes never got in flight"
            time.sleep(0.05)
        paused = self.call("pause", mode)
        in_flight_after_pause = self.call("stats")["policy_calls"]["in_flight"]
        update = self.call("update_weights")
        self.call("resume")
        return {
            "paused": paused,
            "in_flight_after_pause": in_flight_after_pause,
            "update": update,
            "result": ray.get(batch),
            "stats": self.call("stats"),
        }


@contextmanager
def engine_up(tmp_path, port: int, namespace: str, **training: Any) -> Iterator[Any]:
    """A detached engine as `rayrollout up` starts it, and a trainer actor attached to it."""
    config = RunConfig.model_validate(
        {
            "namespace": namespace,
            "environments": {"scheduled": {"path": "fixture_envs:ScheduledRewardEnv"}},
            # One worker: the environment's reward schedule is counted in one process.
            "workers": {"num_workers": 1},
            "concurrency": 32,
            "output": {"dir": str(tmp_path / "out"), "flush_interval_s": 1.0},
            "ray": {"serve_port": port},
            "training": training,
        }
    )
    start_detached(config)  # what `rayrollout up` starts, without its status report
    trainer = Trainer.remote(namespace)
    try:
        yield trainer
    finally:
        ray.kill(trainer)
        down(namespace)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, serve_session) -> Iterator[Any]:
    """One engine for the tests that share the default training config; they look at the
    version and counters relative to where they started."""
    with engine_up(tmp_path_factory.mktemp("training"), serve_session, "training") as actor:
        yield actor


def counters(trainer: Any) -> dict[str, Any]:
    """The figures these tests compare before and after, flat."""
    stats = ray.get(trainer.call.remote("stats"))
    flat = {f"sampling.{k}": v for k, v in stats["dynamic_sampling"].items()}
    flat |= {f"calls.{k}": v for k, v in stats["policy_calls"].items()}
    flat |= {k: stats[k] for k in ("episodes_done", "errors")}
    flat["version"] = stats["policy"]["version"]
    flat["updates"] = stats["policy"]["updates"]
    return flat


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {k: v - before.get(k, 0) for k, v in after.items()}


def scheduled(task_id: str, rewards: list[float], prompt: str = "") -> dict[str, Any]:
    return {
        "task_id": task_id,
        "prompt": prompt or f"note {task_id}",
        "environment": "scheduled",
        "rewards": rewards,
    }


def versions(trajectory: Trajectory) -> list[int]:
    return [turn.policy_version for turn in trajectory.turns]


def test_trainer_actor_drives_generate_by_engine_name_step_after_step(trainer, tmp_path_factory):
    schedules = {"s-a": [1.0, 0.0, 0.0, 1.0], "s-b": [0.5], "s-c": [1.0, 1.0, 0.0, 0.25]}
    tasks = [scheduled(task_id, rewards) for task_id, rewards in schedules.items()]
    before = counters(trainer)
    v0 = before["version"]
    results = ray.get(trainer.steps.remote(tasks, 4, 3))
    written = ray.get(trainer.call.remote("generate", tasks[:1], 2, write=True))
    again = ray.get(trainer.call.remote("generate", tasks[:1], 2, write=True))
    ray.get(trainer.call.remote("flush"))
    stats = ray.get(trainer.call.remote("stats"))
    changed = delta(counters(trainer), before)

    for step, result in enumerate(results):
        assert [g.task_id for g in result.groups] == list(schedules)
        assert result.policy_versions == [v0 + step]
        for group in result.groups:
            rewards = schedules[group.task_id] * (4 // len(schedules[group.task_id]))
            assert [t.sample_index for t in group.trajectories] == [0, 1, 2, 3]
            assert {t.group_id for t in group.trajectories} == {group.task_id}
            assert sorted(group.rewards) == sorted(rewards)
            assert group.reward_mean == pytest.approx(statistics.fmean(rewards))
            assert group.reward_std == pytest.approx(statistics.pstdev(rewards))
            for trajectory in group.trajectories:
                assert trajectory.status == "ok"
                # Two model calls (the tool call, then the answer), both under this step's.
                assert versions(trajectory) == [v0 + step] * 2
                assert trajectory.policy_version == v0 + step
    assert written.policy_versions == [v0 + 3]
    out = ray.get(trainer.call.remote("info"))["output_dir"]
    on_disk = [t for t in read_trajectories(out) if t.task_id == "s-a"]
    # generate() writes when asked, and a second writing call takes the next sample indices,
    # so (task_id, sample_index) stays unique on disk across steps.
    assert [t.sample_index for t in again.trajectories()] == [2, 3]
    assert sorted(t.sample_index for t in on_disk) == [0, 1, 2, 3]
    assert {tuple(versions(t)) for t in on_disk} == {(v0 + 3, v0 + 3)}
    assert changed["episodes_done"] == 3 * 12 + 4 and changed["errors"] == 0
    assert (changed["version"], changed["updates"]) == (3, 3)
    assert changed["sampling.calls"] == 5 and changed["sampling.episodes"] == 40
    assert changed["calls.calls"] == 2 * 40
    assert stats["episodes_in_flight"] == 0 and stats["episodes_per_s"] > 0
    assert stats["by_env"]["scheduled"]["episodes"] >= 40
    assert stats["by_env"]["scheduled"]["errors"] == 0


def test_dynamic_sampling_drops_zero_variance_groups_and_tops_the_batch_up(trainer):
    tasks = [
        scheduled("d-const", [1.0]),  # never any variance: dropped every time
        scheduled("d-a", [1.0, 0.0]),
        scheduled("d-late", [0.0, 0.0, 1.0, 0.0]),  # no variance at first, then some
        scheduled("d-b", [0.0, 1.0]),
        scheduled("d-reserve", [0.0, 1.0]),  # past the batch: the first top-up
    ]
    before = counters(trainer)
    full = ray.get(
        trainer.call.remote(
            "generate", tasks, 2, dynamic_sampling=True, batch_size=4, max_extra_groups=3
        )
    )
    short = ray.get(
        trainer.call.remote("generate", tasks[:2], 2, dynamic_sampling=True, max_extra_groups=1)
    )
    changed = delta(counters(trainer), before)

    # Round 1 keeps d-a, d-b; round 2 runs d-reserve (kept) and d-const again (dropped);
    # round 3 runs d-late again, whose second group has variance.
    assert [g.task_id for g in full.groups] == ["d-a", "d-b", "d-reserve", "d-late"]
    assert (full.groups_dropped, full.extra_groups, full.short_by) == (3, 3, 0)
    late = full.groups[-1]
    assert late.attempt == 1 and [t.sample_index for t in late.trajectories] == [2, 3]
    assert all(g.has_signal and g.reward_std > 0 for g in full.groups)
    # d-const once plus once more (the cap): the batch stays one group short.
    assert [g.task_id for g in short.groups] == ["d-a"]
    assert (short.groups_dropped, short.extra_groups, short.short_by) == (2, 1, 1)
    assert {k: v for k, v in changed.items() if k.startswith("sampling.")} == {
        "sampling.calls": 2,
        "sampling.episodes": 2 * (4 + 2 + 1) + 2 * (2 + 1),
        "sampling.groups_kept": 5,
        "sampling.groups_dropped": 5,
        "sampling.extra_groups": 4,
        "sampling.batches_short": 1,
    }


@pytest.mark.parametrize(
    ("mode", "calls_left_in_flight", "turn_versions", "aborted"),
    [
        ("wait", 0, [0, 1], 0),  # the first call finishes under v; the answer waits for v+1
        ("abort_and_retry", 0, [1, 1], 1),  # the first call is sent again under v+1
        ("continue", 1, [0, 1], 0),  # pause returns at once; the first call goes on under v
    ],
)
def test_pause_update_resume_with_episodes_in_flight_loses_no_episode(
    trainer, mode, calls_left_in_flight, turn_versions, aborted
):
    tasks = [
        scheduled(f"f-{mode}-{i}", [1.0, 0.0], f"note {i} [[sleep={SLEEP_S}]]") for i in range(3)
    ]
    episodes = 3 * 2
    before = counters(trainer)
    v0 = before["version"]
    run = ray.get(trainer.update_while_in_flight.remote(tasks, 2, mode))
    changed = delta(counters(trainer), before)

    assert run["paused"]["calls_in_flight"] == episodes
    assert run["in_flight_after_pause"] == calls_left_in_flight * episodes
    assert run["update"]["version"] == v0 + 1
    trajectories = run["result"].trajectories()
    assert sorted((t.task_id, t.sample_index) for t in trajectories) == [
        (f"f-{mode}-{i}", s) for i in range(3) for s in range(2)
    ]
    assert {t.status for t in trajectories} == {"ok"}
    assert all(sorted(g.rewards) == [0.0, 1.0] for g in run["result"].groups)
    assert {tuple(versions(t)) for t in trajectories} == {tuple(v0 + v for v in turn_versions)}
    assert changed["calls.aborted"] == aborted * episodes
    assert changed["calls.stale_restarts"] == 0 and run["stats"]["policy_calls"]["in_flight"] == 0
    assert changed["episodes_done"] == episodes and changed["errors"] == 0


def test_max_staleness_restarts_episodes_the_update_left_too_far_behind(tmp_path, serve_session):
    tasks = [scheduled(f"st-{i}", [1.0, 0.0], f"note {i} [[sleep={SLEEP_S}]]") for i in range(2)]
    with engine_up(tmp_path, serve_session, "training-stale", max_staleness=0) as trainer:
        run = ray.get(trainer.update_while_in_flight.remote(tasks, 2, "continue"))

    trajectories = run["result"].trajectories()
    assert len(trajectories) == 4 and {t.status for t in trajectories} == {"ok"}
    # Each first turn ran under v0; the next call, under v1, was one version too far:
    # the episode was played again from the start, wholly under v1.
    assert {tuple(versions(t)) for t in trajectories} == {(1, 1)}
    assert run["stats"]["policy_calls"]["stale_restarts"] == 4
    assert run["stats"]["errors"] == 0


def test_weights_update_refuses_a_version_that_does_not_grow_and_a_relative_path(trainer):
    version = counters(trainer)["version"]
    assert ray.get(trainer.call.remote("update_weights", version=version + 5))["version"] == (
        version + 5
    )
    with pytest.raises(ray.exceptions.RayTaskError, match="version must grow"):
        ray.get(trainer.call.remote("update_weights", version=version + 5))
    with pytest.raises(ray.exceptions.RayTaskError, match="must be absolute"):
        ray.get(trainer.call.remote("update_weights", "ckpt/step-1"))
    with pytest.raises(ray.exceptions.RayTaskError, match="unknown pause mode"):
        ray.get(trainer.call.remote("pause", "later"))
    # The scripted policy cannot stop a call and keep its tokens: refused before any pause.
    with pytest.raises(ray.exceptions.RayTaskError, match="'scripted' cannot interrupt"):
        ray.get(trainer.call.remote("pause", "interrupt"))
    stats = ray.get(trainer.call.remote("stats"))
    assert stats["policy"]["version"] == version + 5 and not stats["policy"]["paused"]


def test_vllm_backend_without_control_endpoints_says_how_to_deploy_them(trainer, serve_session):
    """The scripted app answers 404 on /pause, like a vLLM app deployed without them."""
    import asyncio

    from rayrollout.auth import read_token_file
    from rayrollout.deployments.vllm.kind import VllmWeights
    from rayrollout.engine.secret_env import route_token_path
    from rayrollout.engine.weights import WeightUpdateError

    url = f"http://127.0.0.1:{serve_session}/training/policy/v1"
    with pytest.raises(WeightUpdateError, match="HTTP 401"):  # the run's routes want its token
        asyncio.run(VllmWeights(url, "m").pause("wait"))
    # The token file the run wrote for people calling its routes by hand.
    backend = VllmWeights(url, "m", read_token_file(route_token_path("training")))
    with pytest.raises(WeightUpdateError, match="control_endpoints: true"):
        asyncio.run(backend.pause("wait"))


def test_control_endpoints_install_the_weight_reload_worker_extension():
    from rayrollout.deployments.vllm.app import llm_config_kwargs, load_vllm_config

    config = load_vllm_config(ROOT / "rayrollout/deployments/vllm/cpu.yaml")
    assert "worker_extension_cls" not in llm_config_kwargs(config, "m")["engine_kwargs"]
    with_control = config.model_copy(update={"control_endpoints": True})
    engine = llm_config_kwargs(with_control, "m")["engine_kwargs"]
    assert (
        engine["worker_extension_cls"]
        == "rayrollout.deployments.vllm.weight_reload.WeightReloadExtension"
    )


async def test_generate_groups_checks_its_arguments():
    async def run(specs):  # never reached
        raise AssertionError

    task = Task.model_validate(
        {"task_id": "x", "environment": "echo", "prompt": [{"role": "user", "content": "hi"}]}
    )
    with pytest.raises(ValueError, match="at least 2 with dynamic sampling"):
        await generate_groups([task], 1, run, dynamic_sampling=True)
    with pytest.raises(ValueError, match="unique within one generate"):
        await generate_groups([task, task], 2, run)
    with pytest.raises(ValueError, match="batch_size must be between 1 and 1"):
        await generate_groups([task], 2, run, batch_size=2)


def test_group_advantages_are_rewards_centred_and_scaled_by_the_group():
    trajectories = [
        Trajectory(task_id="t", sample_index=i, group_id="t", environment="e", reward=r)
        for i, r in enumerate([1.0, 0.0, 0.0, 1.0])
    ]
    group = Group.of("t", trajectories)
    assert (group.reward_mean, group.reward_std) == (0.5, 0.5)
    assert group.advantages(eps=0.0) == [1.0, -1.0, -1.0, 1.0]
    assert group.advantages(scale=False) == [0.5, -0.5, -0.5, 0.5]


def test_rows_written_before_turns_had_a_policy_version_still_read(tmp_path):
    new = new_row(Turn(completion_token_ids=[1], policy_version=2), policy_version=2)
    row = new.to_row()
    # Parts written before the field existed: turns without policy_version.
    old_row = write_before_and_after(tmp_path / "out", row, {"policy_version"}, policy_version=0)
    by_id = {t.task_id: t for t in read_trajectories(tmp_path / "out")}
    assert by_id["old"].turns[0].policy_version == 0
    assert by_id["new"].turns[0].policy_version == 2 and by_id["new"] == new
    assert Trajectory.from_row(old_row).turns[0].policy_version == 0  # a JSONL row
