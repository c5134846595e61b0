"""Run in TRL's own venv (``.venv-trainers-trl``): TRL 1.16's ``GRPOTrainer`` trains a tiny
model built here (no download: a one-layer Llama over a word-level tokenizer whose ids are the
token policy's) for 2 steps with ``RayrolloutRollout`` as its ``rollout_func`` and its
``weight_sync`` callback, against a running rollout service.

The engine's policy is the tests' token policy (an external server), so the callback saves
the weights and moves the engine's version without a path. Usage:
``python trl_driver.py URL TOKEN OUT.json WORKDIR``. Writes what each ``rollout_func`` call
returned, the rows behind it, the pushes and TRL's log, for the test to check.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from rayrollout.client import RolloutClient
from rayrollout.integrations.trl import (
    RayrolloutRollout,
    TooManyDroppedError,
    dataset_rows,
    episode_reward,
)

VOCAB = 50_001  # the token policy's ids are 1..50000
CITIES = ["Paris", "Tokyo", "Oslo", "Lima"]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, **{f"t{i}": i for i in range(1, VOCAB)}}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>", eos_token="<pad>")


def main(url: str, token: str, out: str, workdir: str) -> None:
    tasks = [
        {"task_id": f"weather-{c.lower()}", "prompt": f"What's the weather like in {c}?"}
        for c in CITIES
    ]
    rollout = RayrolloutRollout(RolloutClient(url, token), tasks, max_staleness=0)
    calls: list[dict[str, Any]] = []

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        answer = rollout(prompts, trainer)
        rows = [s.row.model_dump(mode="json") for s in rollout.last_sequences if s.row]
        calls.append({"prompts": prompts, "answer": answer, "rows": rows})
        return answer

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=1024,
            pad_token_id=0,
            eos_token_id=0,
            bos_token_id=0,
        )
    )
    args = GRPOConfig(
        output_dir=str(Path(workdir) / "trl"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=2,
        max_completion_length=512,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[episode_reward],
        args=args,
        train_dataset=Dataset.from_list(dataset_rows(tasks)),
        processing_class=tokenizer(),
        rollout_func=rollout_func,
        callbacks=[rollout.weight_sync(Path(workdir) / "ckpt", send_path=False)],
    )
    trainer.train()
    saved = sorted(p.name for p in (Path(workdir) / "ckpt").iterdir())
    # The staleness guard: once the weights move past the last batch, its samples are stale.
    rollout.version += 1
    stale_error = None
    try:
        rollout.answer(rollout.last_sequences, 0)
    except TooManyDroppedError as exc:
        stale_error = str(exc)
    rollout.max_dropped_fraction = 1.0
    stale = rollout.answer(rollout.last_sequences, 0)
    # A truncated episode trains only when its status is named trainable.
    rollout.max_staleness = None  # the last batch is stale by now: keep that out of it
    truncated = [dataclasses.replace(s, status="truncated") for s in rollout.last_sequences]
    by_default = rollout.answer(truncated, 0)["env_mask"]
    rollout.trainable = ("ok", "truncated")
    when_asked = rollout.answer(truncated, 0)["env_mask"]
    record = {
        "truncated_masks_by_default": by_default,
        "truncated_masks_when_trainable": when_asked,
        "calls": calls,
        "pushed": rollout.pushed,
        "saved": saved,
        "log": trainer.state.log_history,
        "stale_error": stale_error,
        "stale_status": stale["rayrollout_status"],
        "stale_masks": stale["env_mask"],
    }
    with open(out, "w") as f:
        json.dump(record, f, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:5])
