"""TRL's GRPO with rayrollout as its rollout: a ``rollout_func`` for
``GRPOTrainer(rollout_func=...)`` and a callback that pushes the trained weights to the engine.

TRL calls ``rollout_func(prompts, trainer)`` with its generation batch, each prompt already
repeated ``num_generations`` times in a row, and nothing else of the dataset row: the task is
found from its prompt (``RayrolloutRollout(client, tasks)`` indexes the tasks by prompt; build
the dataset with ``dataset_rows(tasks)``). Each run of equal prompts becomes one task with
``n`` samples (a GRPO group), and the answer is one completion per entry, in order:
``prompt_ids`` (the first turn's prompt), ``completion_ids`` (every later token: the model's
and the environment's), ``logprobs`` aligned with them, ``env_mask`` (1 exactly on the
model's tokens, 0 on those a constraint forced unless ``mask_forced=False``), and as extra
keys for reward functions ``rayrollout_reward``, ``rayrollout_step_rewards``,
``rayrollout_status``, ``rayrollout_policy_version`` and ``task_id``. ``episode_reward`` is
the reward function that returns the episode's reward.

A failed episode, or one played by weights older than ``max_staleness`` versions, keeps its
place with ``env_mask`` all 0 and its status in ``rayrollout_status``: TRL outside its own
vLLM path does not correct stale logprobs, so stale samples must not train. More than
``max_dropped_fraction`` of a batch dropped raises.

``rollout.weight_sync(save_dir)`` is the ``TrainerCallback`` that, after each optimizer step
(or every ``every``), saves the model as safetensors and calls the engine's
``update_weights`` with the folder, so the next batch is played by the new weights.
``pause_mode="interrupt"`` lets a push cut a batch submitted ahead of TRL (``batch_rows``,
``answer_rows``): its calls keep their tokens and go on under the new weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rayrollout.client import RolloutClient
from rayrollout.client.models import PauseAnswer, PauseMode
from rayrollout.errors import InputError
from rayrollout.integrations.errors import TooManyDroppedError
from rayrollout.integrations.sequences import ENVIRONMENT_VERSION, Sequence, flatten, group_rows

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rayrollout.integrations.trl needs TRL: pip install torch==2.13.0 trl==1.16.0"
    ) from exc

__all__ = ["RayrolloutRollout", "TooManyDroppedError", "dataset_rows", "episode_reward"]


def prompt_key(prompt: Any) -> str:
    """A prompt as TRL passes it (text or messages), as one comparable string."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list):
        raise InputError(f"a prompt must be text or a list of messages, got {type(prompt)}")
    messages = [{"role": m.get("role"), "content": m.get("content")} for m in prompt]
    return json.dumps(messages, sort_keys=True)


def dataset_rows(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL dataset rows (``datasets.Dataset.from_list``) for rayrollout task rows: the prompt
    and the task id (TRL passes only the prompt to ``rollout_func``; the id is for you)."""
    return [{"prompt": task["prompt"], "task_id": task.get("task_id", "")} for task in tasks]


def episode_reward(
    prompts: list[Any], completions: list[Any], rayrollout_reward: list[float], **_: Any
) -> list[float]:
    """A TRL reward function: the engine's reward of each episode."""
    return list(rayrollout_reward)


class RayrolloutRollout:
    """``rollout_func`` for TRL's ``GRPOTrainer``: one rayrollout batch per call.

    Args:
        client: The rollout service's client.
        tasks: rayrollout task rows; their prompts must be distinct.
        max_staleness: Samples whose oldest turn is more than this many versions behind the
            last pushed weights are dropped (``env_mask`` 0); None keeps every sample.
        max_dropped_fraction: Raise ``TooManyDroppedError`` when more of a batch is dropped.
        trainable: The episode statuses that train; any other keeps its place with
            ``env_mask`` all 0. ``("ok", "truncated")`` also trains episodes cut at
            ``max_tokens`` (TRL's own generation trains truncated completions by default).
        mask_forced: Tokens a constraint forced (``tool_choice: required``, a grammar) get
            ``env_mask`` 0: the model chose nothing there, and the sampled logprob (0.0) is
            not the model's. False keeps them.
        logprobs: ``"sampled"`` hands TRL the sampling distribution's logprobs (the
            constrained one under a constraint), ``"model"`` the model's own (a turn's
            ``model_logprobs``), which TRL's model recomputes.
    """

    def __init__(
        self,
        client: RolloutClient,
        tasks: list[dict[str, Any]],
        max_staleness: int | None = 0,
        max_dropped_fraction: float = 0.5,
        trainable: tuple[str, ...] = ("ok",),
        mask_forced: bool = True,
        logprobs: Literal["sampled", "model"] = "sampled",
    ) -> None:
        self.client = client
        if logprobs not in ("sampled", "model"):
            raise InputError(f"logprobs must be 'sampled' or 'model', got {logprobs!r}")
        self.mask_forced = mask_forced
        self.logprobs = logprobs
        self.trainable = trainable
        self.max_staleness = max_staleness
        self.max_dropped_fraction = max_dropped_fraction
        self.version = client.stats().policy.version
        self.pushed: list[tuple[int, int]] = []  # (global step, engine version)
        self.last_sequences: list[Sequence] = []
        self.tasks: dict[str, dict[str, Any]] = {}
        for index, task in enumerate(tasks):
            key = prompt_key(task.get("prompt"))
            if key in self.tasks:
                raise InputError(
                    f"tasks[{index}] has the prompt of task {self.tasks[key].get('task_id')!r}: "
                    "TRL passes only the prompt, so prompts must be distinct"
                )
            self.tasks[key] = task

    def _task(self, prompt: Any, index: int) -> dict[str, Any]:
        task = self.tasks.get(prompt_key(prompt))
        if task is None:
            raise InputError(f"prompts[{index}] matches no task: {str(prompt)[:120]!r}")
        return task

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        rows, n = self.batch_rows(prompts)
        return self.answer_rows(rows, self.client.generate(rows, n=n), trainer)

    def batch_rows(self, prompts: list[Any]) -> tuple[list[dict[str, Any]], int]:
        """The task rows and samples per task of one TRL batch of ``prompts`` (what
        ``__call__`` submits; a caller that submits the batch itself, ahead of TRL, uses
        it with ``answer_rows``)."""
        runs: list[tuple[Any, int]] = []  # (prompt, repeats), in order
        for prompt in prompts:
            if runs and runs[-1][0] == prompt:
                runs[-1] = (prompt, runs[-1][1] + 1)
            else:
                runs.append((prompt, 1))
        sizes = {count for _, count in runs}
        if len(sizes) != 1:
            raise InputError(f"prompts must come in runs of num_generations, got {sorted(sizes)}")
        rows = []
        for i, (prompt, _) in enumerate(runs):
            task = dict(self._task(prompt, i))
            task["task_id"] = f"{task.get('task_id') or 'task'}#{i}"  # a prompt may repeat
            rows.append(task)
        return rows, sizes.pop()

    def answer_rows(
        self, rows: list[dict[str, Any]], played: list[Any], trainer: Any = None
    ) -> dict[str, list[Any]]:
        """TRL's answer for the batch ``batch_rows`` made, from the rows the engine played."""
        groups = group_rows(played)
        sequences = [
            flatten(row, self.mask_forced) for task in rows for row in groups[task["task_id"]]
        ]
        self.last_sequences = sequences
        return self.answer(sequences, pad_id(trainer))

    def stale(self, sequence: Sequence) -> bool:
        oldest = sequence.oldest_version
        if self.max_staleness is None or oldest is None:
            return False
        return self.version - oldest > self.max_staleness

    def answer(self, sequences: list[Sequence], pad: int) -> dict[str, list[Any]]:
        """TRL's ``rollout_func`` answer for ``sequences`` (see the module's docstring)."""
        out: dict[str, list[Any]] = {
            k: []
            for k in (
                "prompt_ids",
                "completion_ids",
                "logprobs",
                "env_mask",
                "rayrollout_reward",
                "rayrollout_step_rewards",
                "rayrollout_status",
                "rayrollout_policy_version",
                "rayrollout_token_versions",
                "task_id",
            )
        }
        dropped = []
        for s in sequences:
            usable = s.status in self.trainable and s.response_ids and any(s.mask)
            status = "stale" if usable and self.stale(s) else s.status
            keep = bool(usable) and status != "stale"
            if not keep:
                dropped.append((s, status))
            completion = s.response_ids or [pad]  # TRL reads each completion's last id
            out["prompt_ids"].append(s.prompt_ids)
            out["completion_ids"].append(completion)
            chosen = s.model_logprobs if self.logprobs == "model" else s.logprobs
            out["logprobs"].append(chosen if s.response_ids else [0.0])
            out["env_mask"].append(s.mask if keep and s.response_ids else [0] * len(completion))
            out["rayrollout_reward"].append(float(s.reward))
            out["rayrollout_step_rewards"].append(s.step_rewards)
            out["rayrollout_status"].append(status)
            out["rayrollout_policy_version"].append(s.oldest_version)
            out["rayrollout_token_versions"].append(
                s.token_versions if s.response_ids else [ENVIRONMENT_VERSION]
            )
            out["task_id"].append(s.task_id.rsplit("#", 1)[0])
        if len(dropped) > self.max_dropped_fraction * len(sequences):
            first, status = dropped[0]
            raise TooManyDroppedError(
                f"{len(dropped)} of {len(sequences)} samples dropped (failed or stale); first: "
                f"task {first.task_id!r} sample {first.sample_index}: {status}: {first.error}"
            )
        return out

    def weight_sync(
        self,
        save_dir: str | Path,
        every: int = 1,
        send_path: bool = True,
        pause_mode: PauseMode = "wait",
        before_pause: Callable[[], object] | None = None,
    ) -> Any:
        """The callback that pushes the model to the engine every ``every`` steps
        (``send_path=False``: saves it, and moves only the engine's version). ``pause_mode``
        is how the push treats calls in flight (``"interrupt"``: stopped, their tokens kept
        and continued under the new weights; see ``pauses``). ``before_pause`` runs once the
        checkpoint is saved, right before the pause: a trainer that overlaps generation with
        training can hold the push there for the moment it wants."""
        return WeightSync(self, Path(save_dir), every, send_path, pause_mode, before_pause)


def pad_id(trainer: Any) -> int:
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps one
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


@dataclass(eq=False)  # a callback is itself, whatever its settings
class WeightSync(TrainerCallback):
    """Save the model and load it into the engine after every ``every`` optimizer steps
    (``RayrolloutRollout.weight_sync`` says what each setting does)."""

    rollout: RayrolloutRollout
    save_dir: Path
    every: int = 1
    send_path: bool = True
    pause_mode: PauseMode = "wait"
    before_pause: Callable[[], object] | None = None
    pauses: list[PauseAnswer] = field(default_factory=list)  # one per push: calls it met

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        if model is None or state.global_step % self.every:
            return
        path = (self.save_dir / f"step-{state.global_step}").resolve()
        model.save_pretrained(path, safe_serialization=True)
        if self.before_pause is not None:
            self.before_pause()
        client = self.rollout.client
        self.pauses.append(client.pause(self.pause_mode))
        try:
            version = client.update_weights(str(path) if self.send_path else None).version
        finally:
            client.resume()
        self.rollout.version = version
        self.rollout.pushed.append((state.global_step, version))
