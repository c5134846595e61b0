"""The GRPO example (examples/grpo_loop.py) against real vLLM on Ray Serve LLM (CPU, 2 replicas).

Three training steps: the weights really change on every replica (the served logprobs of a
fixed token sequence move after each update, far past bf16 noise, and every replica serves the
new checkpoint, not the old one), the trajectories of step k carry policy version k, and
the trainer's logprobs on the returned ids match vLLM's. Then weight updates while a batch
is in flight, in each pause mode: no episode is lost.

The app and the engine are the tier's shared ones (``tiny_vllm``, tests/vllm/conftest.py:
the example's engine deployed it); the module loads the original weights back at its end,
for the tier's other tests of that app.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from vllm_tier import TinyVllm, gap

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROBE_PROMPT = "What is the weather like in Paris today?"
LR = 5e-3


@pytest.fixture(scope="module")
def services(tiny_vllm: TinyVllm) -> Iterator[TinyVllm]:
    """The shared app and its engine; its first weights in place again afterwards."""
    yield tiny_vllm
    engine = tiny_vllm.engine.engine
    update = ray.get(engine.update_weights.remote(str(tiny_vllm.model_path)), timeout=600)
    assert update["replicas"] == 2, update


PROBE_IDS = list(range(100, 164))  # a fixed token sequence to score on server and trainer


def served_logprobs(services: TinyVllm) -> list[list[float]]:
    """The served model's logprobs of PROBE_IDS, from four requests (replicas)."""
    return services.prompt_logprobs(PROBE_IDS, tries=4)


def checkpoint_logprobs(path: Path) -> list[float]:
    """The same logprobs from the checkpoint itself, with transformers in float32."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logprobs = model(torch.tensor([PROBE_IDS])).logits[0].float().log_softmax(-1)
    return logprobs[:-1].gather(-1, torch.tensor(PROBE_IDS[1:])[:, None])[:, 0].tolist()


def test_control_routes_answer_only_the_runs_token(services):
    """/pause and /collective_rpc pause the model and run methods in its workers: without the
    run's token they answer 401 and nothing pauses; with it the control plane answers."""
    import httpx

    root = services.base_url.removesuffix("/v1")
    token = {"Authorization": f"Bearer {services.token}"}
    for route, body in (
        ("pause", {"model": services.model, "options": {"mode": "abort"}}),
        ("collective_rpc", {"model": services.model, "method": "rayrollout_reload_weights"}),
    ):
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            refused = httpx.post(f"{root}/{route}", json=body, headers=headers, timeout=60)
            assert refused.status_code == 401, (route, refused.text)
    paused = httpx.get(f"{root}/is_paused", params={"model": services.model}, headers=token)
    assert paused.status_code == 200, paused.text
    assert "true" not in paused.text.lower(), paused.text  # the refused /pause did nothing


def test_grpo_example_runs_three_steps_and_the_weights_really_change(services):
    from examples.grpo_loop import NAMESPACE, GrpoTrainer, tasks

    trainer = GrpoTrainer.remote(
        NAMESPACE, str(services.model_path), str(services.work_dir / "checkpoints"), LR
    )
    first = ray.get(services.engine.engine.stats.remote())["policy"]["version"]
    records, checkpoints, served = [], [services.model_path], [served_logprobs(services)]
    for step in range(3):
        records.append(ray.get(trainer.step.remote(step, tasks(), 4)))
        checkpoints.append(Path(records[-1]["update"]["path"]))
        served.append(served_logprobs(services))
    ray.kill(trainer)

    for step, record in enumerate(records):
        batch = record.pop("batch")
        print(f"step {step}: {record}")
        trajectories = batch.trajectories()
        assert len(trajectories) == 16 and len(batch.groups) == 4
        assert {t.status for t in trajectories} <= {"ok", "truncated"}, [
            t.error for t in trajectories
        ]
        version = first + step  # the shared engine's: 0 unless a test updated it before
        assert batch.policy_versions == [version]
        for t in trajectories:
            assert t.policy_version == version
            assert [turn.policy_version for turn in t.turns] == [version]
            turn = t.turns[0]
            assert len(turn.logprobs) == len(turn.completion_token_ids) > 0
        assert record["update"]["version"] == version + 1
        assert record["update"]["replicas"] == 2  # every replica reloaded the checkpoint
        # The trainer's logprobs on the returned ids are vLLM's, up to bf16: same weights
        # (the checkpoint of the step before) and exactly the sampled ids.
        assert record["logprob_gap"] < 0.01, record
    # Each update moves what every replica serves by far more than bf16 noise (the greedy
    # text is no probe: the random model often answers "" before and after a step)...
    moved = [round(gap(served[k][0], served[k - 1][0]), 4) for k in range(1, len(served))]
    spread = [round(max(gap(a, answers[0]) for a in answers), 4) for answers in served]
    print(f"served logprobs moved per update: {moved}; spread across replicas: {spread}")
    assert all(step_moved > 0.02 for step_moved in moved), moved
    assert all(s < 0.01 for s in spread), spread  # both replicas answer alike
    # ...and every answer after update k scores like checkpoint k (up to bf16), not k - 1.
    for k, answers in enumerate(served[1:], start=1):
        new, old = checkpoint_logprobs(checkpoints[k]), checkpoint_logprobs(checkpoints[k - 1])
        gaps = [(round(gap(a, new), 4), round(gap(a, old), 4)) for a in answers]
        print(f"update {k}: served vs checkpoint {k} / {k - 1}: {gaps}")
        for to_new, to_old in gaps:
            assert to_new < 0.01 and to_old > 3 * to_new, gaps


@pytest.mark.parametrize("mode", ["abort_and_retry", "wait", "continue", "interrupt"])
def test_weights_update_with_episodes_in_flight_loses_no_episode(services, mode):
    from examples.grpo_loop import tasks

    engine = ray.get_actor("engine", namespace="grpo-example")
    checkpoint = perturbed_checkpoint(services, mode)
    rows = [{**row, "sampling": {"max_tokens": 96}} for row in tasks()]
    version = ray.get(engine.stats.remote())["policy"]["version"]

    batch = engine.generate.remote(rows, 4)
    deadline = time.monotonic() + 120
    while ray.get(engine.stats.remote())["policy_calls"]["in_flight"] < 8:
        assert time.monotonic() < deadline, "episodes never got in flight"
        time.sleep(0.05)
    paused = ray.get(engine.pause.remote(mode))
    update = ray.get(engine.update_weights.remote(str(checkpoint)))
    ray.get(engine.resume.remote())
    result = ray.get(batch)
    stats = ray.get(engine.stats.remote())

    trajectories = result.trajectories()
    print(f"\n{mode}: paused {paused}, update {update}, versions {result.policy_versions}")
    assert len(trajectories) == 16  # no episode lost
    assert {t.status for t in trajectories} <= {"ok", "truncated"}, [t.error for t in trajectories]
    assert paused["calls_in_flight"] >= 8 and update["replicas"] == 2
    assert update["version"] == version + 1
    assert set(result.policy_versions) <= {version, version + 1}
    assert stats["policy_calls"]["in_flight"] == 0 and not stats["policy"]["paused"]
    for t in trajectories:
        assert len(t.turns[0].logprobs) == len(t.turns[0].completion_token_ids) > 0
    # The weights in place are the checkpoint's, on every replica.
    expected = checkpoint_logprobs(checkpoint)
    assert all(gap(a, expected) < 0.01 for a in served_logprobs(services))
    if mode == "abort_and_retry":
        # Every call in flight at the pause went out again under the new version.
        assert (
            sum(t.policy_version == version + 1 for t in trajectories) >= paused["calls_in_flight"]
        )


# Long generations (several seconds each at this tiny model's pace, even on an idle machine):
# an update half a second after they are all in flight lands in their middle.
CUT_TOKENS = 640


def greedy_continuation(services: TinyVllm, prompt: list[int], count: int) -> dict:
    """What the served weights give greedily after ``prompt``: ``count`` token ids."""
    return services.completions(prompt=prompt, max_tokens=count, logprobs=0, return_token_ids=True)


@pytest.mark.parametrize("mode", ["interrupt", "continue"])
def test_an_update_mid_generation_keeps_the_tokens_and_labels_each_with_its_weights(services, mode):
    """Greedy generations of CUT_TOKENS tokens, an update in their middle. 'interrupt': pause()
    returns with every call stopped, its tokens kept (stopped_calls); each finished turn holds
    them byte for byte under the old version, then the new weights' greedy continuation of
    that exact prefix under the new version. 'continue': the same labels and continuation."""
    from examples.grpo_loop import tasks

    engine = ray.get_actor("engine", namespace="grpo-example")
    checkpoint = perturbed_checkpoint(services, f"cut-{mode}")
    rows = [{**row, "sampling": {"max_tokens": CUT_TOKENS, "temperature": 0.0}} for row in tasks()]
    before = ray.get(engine.stats.remote())
    version = before["policy"]["version"]

    batch = engine.generate.remote(rows, 2)
    deadline = time.monotonic() + 120
    while ray.get(engine.stats.remote())["policy_calls"]["in_flight"] < 8:
        assert time.monotonic() < deadline, "episodes never got in flight"
        time.sleep(0.05)
    time.sleep(0.5)  # tokens generated under the old weights
    paused = ray.get(engine.pause.remote(mode))
    if mode == "interrupt":  # pause() returned: every call in flight is stopped and back
        stopped = {c["episode_id"]: c for c in ray.get(engine.stopped_calls.remote())}
        assert len(stopped) == paused["calls_in_flight"] >= 8, (paused, len(stopped))
    update = ray.get(engine.update_weights.remote(str(checkpoint)))
    ray.get(engine.resume.remote())
    result = ray.get(batch)
    after = ray.get(engine.stats.remote())

    trajectories = result.trajectories()
    keys = [(t.task_id, t.sample_index) for t in trajectories]
    assert len(keys) == len(set(keys)) == 2 * len(rows)  # none lost, none twice
    assert {t.status for t in trajectories} <= {"ok", "truncated"}, [t.error for t in trajectories]
    assert update["version"] == version + 1
    cut, continuation_checked = [], 0
    for t in trajectories:
        turn = t.turns[0]
        versions = turn.token_versions
        assert len(versions) == len(turn.completion_token_ids) == len(turn.logprobs) > 0
        assert set(versions) <= {version, version + 1} and versions == sorted(versions)
        assert turn.policy_version == versions[0]
        if len(set(versions)) == 2:
            cut.append((t, versions.index(version + 1)))
    calls = {
        k: after["policy_calls"][k] - before["policy_calls"][k]
        for k in ("interrupted", "kept_tokens", "discarded_tokens")
    }
    print(f"\n{mode}: paused {paused}; {len(cut)} turns cut by the update; calls {calls}")
    assert len(cut) >= 4 and calls["discarded_tokens"] == 0
    assert calls["interrupted"] == len(cut)  # every call stopped with tokens, and only those
    assert calls["kept_tokens"] == sum(k for _, k in cut)
    if mode == "interrupt":
        assert len(stopped) == len(cut)
    mismatches = []
    for t, k in cut:
        turn = t.turns[0]
        if mode == "interrupt":
            (kept,) = [
                c for e, c in stopped.items() if e.startswith(f"{t.task_id}:{t.sample_index}:")
            ]
            # The kept tokens and logprobs, byte for byte, under the old version.
            assert kept["prompt_token_ids"] == turn.prompt_token_ids
            assert kept["completion_token_ids"] == turn.completion_token_ids[:k]
            assert kept["logprobs"] == turn.logprobs[:k]
            assert kept["token_versions"] == [version] * k
        # After the cut: what the new weights give greedily for the same prefix.
        rest = len(turn.completion_token_ids) - k
        expected = greedy_continuation(
            services, turn.prompt_token_ids + turn.completion_token_ids[:k], rest
        )
        continuation_checked += 1
        if expected["token_ids"] != turn.completion_token_ids[k:]:
            mismatches.append((t.task_id, t.sample_index, k, rest))
    print(f"{mode}: continuations checked {continuation_checked}, mismatches {mismatches}")
    assert not mismatches


def perturbed_checkpoint(services: TinyVllm, name: str) -> Path:
    """The tiny model with noise on every weight, saved as safetensors."""
    import torch
    import transformers

    path = services.work_dir / f"perturbed-{name}"
    if not path.exists():
        torch.manual_seed(len(name))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            services.model_path, dtype=torch.float32
        )
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.01)
        model.save_pretrained(path, safe_serialization=True)
    return path
