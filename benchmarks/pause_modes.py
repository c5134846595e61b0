"""Weight updates every K seconds while episodes are in flight, per pause mode, on vLLM CPU.

Deploys the tiny random-weight model on Ray Serve LLM (examples/grpo_loop.py's engine:
kind ``vllm``, token-ids mode, control endpoints, vLLM's metrics exported) and, per pause
mode (``wait``, ``abort_and_retry``, ``continue``, ``interrupt``), runs ``generate`` batches
of one-turn episodes back to back (``ignore_eos``: every call generates ``--max-tokens``), so
episodes are always in flight, while the driver calls ``pause(mode)``, ``update_weights``
(the model and a perturbed copy, alternately) and ``resume()`` every ``--every`` seconds,
until ``--updates`` updates and the batch in flight are done. Per mode:

- ``tokens_generated``: vLLM's own count of generated tokens over the mode's stretch;
- ``tokens_kept``: completion tokens the returned turns hold;
- ``tokens_thrown_away``: generated minus kept (calls cancelled and generated again);
- ``pause_wait_s``: mean and max seconds ``pause()`` held the trainer; ``update_s`` the load;
- ``episodes_per_s`` and ``tokens_per_s`` (kept tokens) over the stretch's wall time;
- the gate's ``interrupted`` calls, ``kept_tokens`` and ``discarded_tokens``.

    python benchmarks/pause_modes.py          # 4 modes x >= 3 updates: several minutes
    python benchmarks/pause_modes.py --smoke  # checks it still works
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit, free_port, keep_stdout_for_json, start_ray_with_metrics, stop_ray  # noqa: E402
from result_files import run_benchmark  # noqa: E402
from vllm_counters import scrape_counters, wait_for_counters  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("wait", "abort_and_retry", "continue", "interrupt")
_FIGURES = ("interrupted", "kept_tokens", "discarded_tokens", "aborted")


def perturbed(model: Path, folder: Path) -> Path:
    """The model with noise on every weight (safetensors): the other checkpoint."""
    import torch
    import transformers

    path = folder / "perturbed"
    torch.manual_seed(0)
    weights = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():
        for parameter in weights.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    weights.save_pretrained(path, safe_serialization=True)
    return path


def settled_counters(port: int, now: dict[str, Any], quiet_s: float = 3.0) -> dict[str, Any]:
    """vLLM's counters once they stop moving for ``quiet_s`` (Ray exports them in batches):
    tokens of calls cancelled late in a stretch are counted in it, not in the next one."""
    while True:
        time.sleep(quiet_s)
        later = scrape_counters(port)
        if later["totals"] == now["totals"]:
            return {**later, "complete": now.get("complete", True)}
        now = {**later, "complete": now.get("complete", True)}


def run_mode(
    actor: Any,
    mode: str,
    rows: list[dict[str, Any]],
    samples: int,
    checkpoints: list[Path],
    every_s: float,
    updates: int,
    metrics_port: int,
) -> dict[str, Any]:
    """One mode's stretch: batches with updates every ``every_s`` until ``updates`` done."""
    import ray

    before = scrape_counters(metrics_port)
    calls_before = ray.get(actor.stats.remote())["policy_calls"]
    waits, loads, episodes, kept = [], [], 0, 0
    started = time.monotonic()
    batch = actor.generate.remote(rows, samples, write=False)
    # Batches back to back, so episodes are always in flight; updates on the clock.
    while len(waits) < updates:
        next_update = started + every_s * (len(waits) + 1)
        done, _ = ray.wait([batch], timeout=max(0.0, next_update - time.monotonic()))
        if done:
            trajectories = ray.get(batch).trajectories()
            episodes += len(trajectories)
            kept += sum(len(turn.completion_token_ids) for t in trajectories for turn in t.turns)
            batch = actor.generate.remote(rows, samples, write=False)
            continue
        began = time.monotonic()
        ray.get(actor.pause.remote(mode))
        waits.append(time.monotonic() - began)
        began = time.monotonic()
        ray.get(actor.update_weights.remote(str(checkpoints[len(waits) % 2])))
        loads.append(time.monotonic() - began)
        ray.get(actor.resume.remote())
    trajectories = ray.get(batch).trajectories()  # the batch the last update cut
    episodes += len(trajectories)
    kept += sum(len(turn.completion_token_ids) for t in trajectories for turn in t.turns)
    wall = time.monotonic() - started
    after = settled_counters(metrics_port, wait_for_counters(metrics_port, before, 0, kept))
    calls_after = ray.get(actor.stats.remote())["policy_calls"]
    generated = int(
        after["totals"].get("generation_tokens", 0) - before["totals"].get("generation_tokens", 0)
    )
    return {
        "updates": len(waits),
        "episodes": episodes,
        "tokens_generated": generated,
        "tokens_kept": kept,
        "tokens_thrown_away": generated - kept,
        "counters_complete": after["complete"],
        "pause_wait_s": {
            "mean": round(statistics.mean(waits), 3),
            "max": round(max(waits), 3),
        },
        "update_s": round(statistics.mean(loads), 3),
        "episodes_per_s": round(episodes / wall, 3),
        "tokens_per_s": round(kept / wall, 1),
        "wall_s": round(wall, 1),
        **{k: calls_after[k] - calls_before[k] for k in _FIGURES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=16, help="per batch (tasks x samples)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between updates")
    parser.add_argument("--updates", type=int, default=3, help="updates per mode, at least")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--smoke", action="store_true", help="tiny run: checks it works")
    args = parser.parse_args()
    keep_stdout_for_json()  # Ray's and vLLM's output to stderr, the JSON alone to stdout
    if args.smoke:
        args.episodes, args.max_tokens, args.every, args.updates = 8, 96, 1.0, 3

    import ray

    from examples.grpo_loop import run_config, tasks
    from rayrollout import RolloutEngine
    from rayrollout.deployments.vllm.tiny_model import build_tiny_model

    # Workers import the example's environment as examples.grpo_loop: the repo on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    metrics_port = start_ray_with_metrics()
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            model = build_tiny_model(folder / "model")
            deployment = yaml.safe_load((ROOT / "rayrollout/deployments/vllm/cpu.yaml").read_text())
            deployment["engine_metrics"] = True
            deployment["replicas"] = 1
            (folder / "cpu.yaml").write_text(yaml.safe_dump(deployment))
            config = run_config(
                model,
                folder / "work",
                free_port(),
                args.max_tokens,
                deployment_file=folder / "cpu.yaml",
                namespace="bench-pause-modes",
            )
            config.policy.extra_body = {"ignore_eos": True}
            config.training.weights_roots = [str(folder.resolve())]
            checkpoints = [model, perturbed(model, folder)]
            prompts = tasks()
            samples = max(1, args.episodes // len(prompts))
            with RolloutEngine(config) as rollout:
                rollout.start()  # Serve, vLLM (minutes on CPU), the engine named "engine"
                actor = ray.get_actor("engine", namespace=config.namespace)
                counted = scrape_counters(metrics_port)
                ray.get(actor.generate.remote(prompts[:1], 1, write=False))  # warm up
                # The warm-up's tokens in vLLM's counters before the first mode's stretch.
                settled_counters(
                    metrics_port, wait_for_counters(metrics_port, counted, 1, args.max_tokens)
                )
                for mode in args.modes.split(","):
                    results[mode] = run_mode(
                        actor,
                        mode,
                        prompts,
                        samples,
                        checkpoints,
                        args.every,
                        args.updates,
                        metrics_port,
                    )
                    print(f"{mode}: {results[mode]}", file=sys.stderr)
    finally:
        stop_ray()
    emit(
        {
            "modes": results,
            "episodes_per_batch": samples * len(prompts),
            "max_tokens": args.max_tokens,
            "every_s": args.every,
            "replicas": 1,
            "smoke": args.smoke,
        }
    )


if __name__ == "__main__":
    run_benchmark(main)
