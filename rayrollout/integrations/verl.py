"""verl's rollout, played by rayrollout: ``RayrolloutAgentLoopManager`` is what verl's
``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` names, and
``RayrolloutCheckpointManager`` what ``actor_rollout_ref.rollout.checkpoint_manager_class``
names, in verl's ``RayPPOTrainer`` (``trainer.use_v1=false``; verl's V1 trainer reads its
rollouts from its TransferQueue instead).

verl's trainer hands the manager a ``DataProto`` already repeated ``rollout.n`` times
(interleaved: each prompt's samples in a row, sharing its ``uid``). The manager submits each
prompt once with ``n`` samples (a GRPO group) in one rayrollout batch, waits for the rows,
and answers the ``DataProto`` verl's own ``AgentLoopWorker`` answers, in the input's order:
``prompts`` left-padded to ``rollout.prompt_length``, ``responses``, ``response_mask`` and
``rollout_log_probs`` right-padded to ``rollout.response_length``, ``input_ids``,
``attention_mask``, ``position_ids``, and ``rm_scores`` (the episode's reward on its last
response token). Ids are the engine's, never re-tokenized; the mask is 1 exactly on policy
tokens. A sequence longer than verl's lengths is cut as verl's own agent loops cut it (the
prompt's start, the response's end) and counted. A failed episode keeps its place with a
mask of zeros, its status in ``rayrollout_status``; more than ``max_failed_fraction`` of a
batch failing raises.

Weights: ``RayrolloutCheckpointManager.update_weights`` saves the actor's weights as a
Hugging Face folder and calls the engine's ``update_weights`` with its path.

Runs in verl's own venv with only ``rayrollout-client``: this module imports verl, torch and
numpy, and nothing of rayrollout beyond the client.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rayrollout.client import RolloutClient
from rayrollout.errors import InputError, RayrolloutError
from rayrollout.integrations.sequences import (
    ENVIRONMENT_VERSION,
    Sequence,
    TooManyFailuresError,
    check_failures,
    flatten,
    group_rows,
    task_row,
)

try:
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.utils.model import compute_position_id_with_mask
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rayrollout.integrations.verl needs verl: pip install torch==2.13.0 verl==0.9.1 "
        "cachetools uvicorn fastapi"
    ) from exc

__all__ = ["RayrolloutAgentLoopManager", "RayrolloutCheckpointManager", "TooManyFailuresError"]

# verl's own keys of a dataset row's ``extra_info``; the task row's fields go under
# ``extra_info["rayrollout"]``.
TASK_KEY = "rayrollout"


def settings(config: Any) -> dict[str, Any]:
    """The ``rayrollout`` section of verl's config (``+rayrollout.url=...``), as a dict."""
    section = config.get(TASK_KEY) if config is not None else None
    if section is None:
        return {}
    try:
        from omegaconf import OmegaConf

        return dict(OmegaConf.to_container(section, resolve=True))  # type: ignore[arg-type]
    except (ImportError, ValueError):
        return dict(section)


def client_from(options: dict[str, Any]) -> RolloutClient:
    url = options.get("url") or os.environ.get("RAYROLLOUT_URL")
    if not url:
        raise InputError(
            "rayrollout.url is not set: add +rayrollout.url=http://HOST:PORT to verl's config "
            "(or set RAYROLLOUT_URL); `rayrollout status` prints it"
        )
    return RolloutClient(
        url,
        options.get("token") or os.environ.get("RAYROLLOUT_TOKEN"),
        token_file=options.get("token_file") or os.environ.get("RAYROLLOUT_TOKEN_FILE"),
        timeout_s=float(options.get("timeout_s", 60.0)),
    )


def plain(value: Any) -> Any:
    """A numpy or OmegaConf value as plain Python (lists, dicts, scalars)."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "items") and hasattr(value, "keys"):  # a DictConfig
        return {str(k): plain(v) for k, v in value.items()}
    return value


class RayrolloutAgentLoopManager:
    """verl's agent-loop manager whose batches rayrollout plays.

    verl builds it with ``create(config=..., llm_client=..., teacher_client=...,
    reward_loop_worker_handles=...)``; the verl clients are not used (the engine serves the
    policy). Settings come from the ``rayrollout`` section of verl's config, or as arguments:

    Args:
        config: verl's whole config (``rollout.prompt_length``, ``response_length``,
            ``temperature``, ``top_p``, ``val_kwargs``) and its ``rayrollout`` section: ``url``,
            ``token`` or ``token_file``, ``environments`` (``data_source`` -> rayrollout
            environment), ``max_failed_fraction`` (default 0.5), ``max_tokens`` (per model
            call), ``pad_token_id`` (default: the tokenizer's, else 0), ``write`` (also write
            the rows to the run's output folder), ``mask_forced`` (default true: the tokens
            a constraint forced are 0 in ``response_mask``).
        client: The rollout service's client (default: built from the settings).
    """

    def __init__(
        self,
        config: Any,
        llm_client: Any = None,
        teacher_client: Any = None,
        reward_loop_worker_handles: Any = None,
        *,
        client: RolloutClient | None = None,
    ) -> None:
        self.config = config
        options = settings(config)
        self.options = options
        self.client = client or client_from(options)
        rollout = config.actor_rollout_ref.rollout
        self.rollout = rollout
        self.prompt_length = int(rollout.prompt_length)
        self.response_length = int(rollout.response_length)
        self.environments: dict[str, str] = dict(options.get("environments") or {})
        self.max_failed_fraction = float(options.get("max_failed_fraction", 0.5))
        self.write: bool | None = options.get("write")
        self.mask_forced = bool(options.get("mask_forced", True))
        self.pad_token_id = self._pad_id(options.get("pad_token_id"))
        self.last_sequences: list[Sequence] = []
        self.last_failures: list[Sequence] = []
        self.truncated = 0

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> RayrolloutAgentLoopManager:
        """What verl's trainer calls (``AgentLoopManager.create``)."""
        return cls(*args, **kwargs)

    def _pad_id(self, configured: Any) -> int:
        if configured is not None:
            return int(configured)
        path = self.config.actor_rollout_ref.model.get("path")
        if path and Path(str(path)).is_dir():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path))
            for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
                if isinstance(value, int):
                    return value
        return 0

    def sampling(self, validate: bool) -> dict[str, Any]:
        """The task rows' ``sampling`` from verl's rollout config."""
        source = self.rollout.val_kwargs if validate else self.rollout
        sampling: dict[str, Any] = {
            "temperature": float(source.temperature),
            "top_p": float(source.top_p),
        }
        if self.options.get("max_tokens"):
            sampling["max_tokens"] = int(self.options["max_tokens"])
        return sampling

    def tasks(self, batch: DataProto) -> tuple[list[dict[str, Any]], int, list[tuple[str, int]]]:
        """Each prompt once as a rayrollout task row, the samples per prompt, and for each
        input row its (task id, position in the group)."""
        size = len(batch)
        columns = batch.non_tensor_batch
        if "raw_prompt" not in columns:
            raise InputError("the batch has no 'raw_prompt' column (verl's RLHFDataset adds it)")
        keys = columns.get("uid")
        if keys is None:
            keys = np.array([f"row-{i}" for i in range(size)], dtype=object)
        sampling = self.sampling(bool(batch.meta_info.get("validate", False)))
        rows: dict[str, dict[str, Any]] = {}
        places: list[tuple[str, int]] = []
        counts: dict[str, int] = {}
        for i in range(size):
            key = str(keys[i])
            places.append((key, counts.get(key, 0)))
            counts[key] = counts.get(key, 0) + 1
            if key in rows:
                continue
            extra = plain(columns["extra_info"][i]) if "extra_info" in columns else {}
            fields = dict((extra or {}).get(TASK_KEY) or {})
            environment = fields.pop("environment", None)
            if environment is None and "data_source" in columns:
                environment = self.environments.get(str(columns["data_source"][i]))
            fields["sampling"] = {**sampling, **(fields.get("sampling") or {})}
            prompt = plain(columns["raw_prompt"][i])
            if not prompt:
                raise InputError(f"row {i} (uid {key!r}): raw_prompt is empty")
            rows[key] = task_row(key, prompt, environment, fields)
        sizes = set(counts.values())
        if len(sizes) != 1:
            raise InputError(f"every uid needs the same number of samples, got {counts}")
        return list(rows.values()), sizes.pop(), places

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One rayrollout batch for verl's batch, answered as verl's padded ``DataProto``."""
        tasks, n, places = self.tasks(prompts)
        status = self.client.submit(tasks, n=n, write=self.write)
        groups = group_rows(self.client.wait(status.batch_id))
        sequences = []
        for key, position in places:
            group = groups.get(key, [])
            if position >= len(group):
                raise RayrolloutError(
                    f"task {key!r}: the engine returned {len(group)} rows, wanted {n}"
                )
            sequences.append(flatten(group[position], self.mask_forced))
        self.last_sequences = sequences
        self.check_failures(sequences)
        return self.to_data_proto(sequences, prompts)

    def check_failures(self, sequences: list[Sequence]) -> None:
        """Keep the failures in ``last_failures``; raise when there are too many."""
        self.last_failures = check_failures(sequences, self.max_failed_fraction)

    def to_data_proto(self, sequences: list[Sequence], source: DataProto) -> DataProto:
        """verl's padded batch for ``sequences`` (one per row of ``source``, in order)."""
        size, plen, rlen = len(sequences), self.prompt_length, self.response_length
        prompts = torch.full((size, plen), self.pad_token_id, dtype=torch.long)
        responses = torch.full((size, rlen), self.pad_token_id, dtype=torch.long)
        prompt_attention = torch.zeros((size, plen), dtype=torch.long)
        response_attention = torch.zeros((size, rlen), dtype=torch.long)
        response_mask = torch.zeros((size, rlen), dtype=torch.long)
        logprobs = torch.zeros((size, rlen), dtype=torch.float32)
        rm_scores = torch.zeros((size, rlen), dtype=torch.float32)
        # Beside rollout_log_probs: the weight version of each response token, -1 elsewhere.
        token_versions = torch.full((size, rlen), ENVIRONMENT_VERSION, dtype=torch.long)
        truncated = 0
        for i, s in enumerate(sequences):
            prompt = s.prompt_ids[-plen:]  # verl's agent loops keep a prompt's end
            response, mask, lps = s.response_ids[:rlen], s.mask[:rlen], s.logprobs[:rlen]
            truncated += len(prompt) < len(s.prompt_ids) or len(response) < len(s.response_ids)
            if prompt:
                prompts[i, plen - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
                prompt_attention[i, plen - len(prompt) :] = 1
            if response:
                responses[i, : len(response)] = torch.tensor(response, dtype=torch.long)
                response_attention[i, : len(response)] = 1
                response_mask[i, : len(mask)] = torch.tensor(mask, dtype=torch.long)
                logprobs[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
                made_by = s.token_versions[:rlen]
                token_versions[i, : len(made_by)] = torch.tensor(made_by, dtype=torch.long)
                rm_scores[i, len(response) - 1] = float(s.reward)
        self.truncated = truncated
        attention_mask = torch.cat([prompt_attention, response_attention], dim=1)
        batch = TensorDict(
            {
                "prompts": prompts,
                "responses": responses,
                "response_mask": response_mask,
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": attention_mask,
                "position_ids": compute_position_id_with_mask(attention_mask),
                "rollout_log_probs": logprobs,
                "rayrollout_token_versions": token_versions,
                "rm_scores": rm_scores,
            },
            batch_size=size,
        )
        non_tensor: dict[str, Any] = dict(source.non_tensor_batch)
        non_tensor["__num_turns__"] = np.array([s.num_turns for s in sequences], dtype=np.int32)
        non_tensor["rayrollout_status"] = np.array([s.status for s in sequences], dtype=object)
        non_tensor["rayrollout_error"] = np.array([s.error for s in sequences], dtype=object)
        non_tensor["rayrollout_task_id"] = np.array([s.task_id for s in sequences], dtype=object)
        non_tensor["rayrollout_sample_index"] = np.array(
            [s.sample_index for s in sequences], dtype=np.int64
        )
        non_tensor["rayrollout_policy_version"] = np.array(
            [-1 if s.oldest_version is None else s.oldest_version for s in sequences],
            dtype=np.int64,
        )
        if "multi_modal_inputs" not in non_tensor:  # verl's trainer reads it for every row
            non_tensor["multi_modal_inputs"] = np.array([{} for _ in sequences], dtype=object)
        versions = [v for s in sequences for v in s.policy_versions]
        timing = {
            "rayrollout/failed_episodes": float(sum(s.failed for s in sequences)),
            "rayrollout/truncated_sequences": float(truncated),
            "rayrollout/mean_turns": sum(s.num_turns for s in sequences) / max(size, 1),
            "rayrollout/oldest_policy_version": float(min(versions, default=0)),
        }
        return DataProto(
            batch=batch,
            non_tensor_batch=non_tensor,
            meta_info={"timing": timing, "reward_extra_keys": []},
        )


class RayrolloutCheckpointManager:
    """verl's checkpoint-engine manager for a rayrollout engine: weights go by path.

    verl builds it with ``(config, actor_wg, replicas)`` and calls ``update_weights(step)``
    after each training step and ``sleep_replicas()`` after each rollout. ``update_weights``
    has the actor save a checkpoint under ``save_dir/global_step_N`` with verl's
    ``save_checkpoint`` (``hf_model`` in ``actor.checkpoint.save_contents`` adds its Hugging
    Face copy, ``huggingface/``), then pauses the engine, loads that copy into it and
    resumes. The folder must be readable on the engine's machines.

    Args:
        config: verl's ``rollout.checkpoint_engine`` config (unused) or anything.
        actor_wg: verl's actor worker group.
        replicas: verl's rollout replicas (unused: the engine is rayrollout's).
        client: The rollout service's client (default: from ``RAYROLLOUT_URL`` and
            ``RAYROLLOUT_TOKEN_FILE``).
        save_dir: Where checkpoints go (default ``RAYROLLOUT_CHECKPOINT_DIR``).
    """

    def __init__(
        self,
        config: Any = None,
        actor_wg: Any = None,
        replicas: Any = None,
        *,
        client: RolloutClient | None = None,
        save_dir: str | Path | None = None,
    ) -> None:
        self.actor_wg = actor_wg
        self.client = client or client_from({})
        directory = save_dir or os.environ.get("RAYROLLOUT_CHECKPOINT_DIR")
        if not directory:
            raise InputError(
                "RayrolloutCheckpointManager needs a save_dir (or RAYROLLOUT_CHECKPOINT_DIR): "
                "an absolute folder the engine can read"
            )
        self.save_dir = Path(directory).resolve()
        self.pushed: list[tuple[int, int]] = []  # (global step, engine policy version)

    def sleep_replicas(self) -> None:
        """Nothing to free: the engine's replicas are rayrollout's."""

    def save(self, global_steps: int) -> Path:
        """verl's checkpoint of the actor; its Hugging Face copy (``hf_model``) is the path."""
        path = self.save_dir / f"global_step_{global_steps}"
        self.actor_wg.save_checkpoint(str(path), None, global_steps, None)
        return path / "huggingface"

    def update_weights(self, global_steps: int | None = None) -> int:
        """Save the actor's weights and load them into the engine; the engine's new version."""
        step = int(global_steps or 0)
        path = self.save(step)
        self.client.pause("wait")
        try:
            version = self.client.update_weights(str(path)).version
        finally:
            self.client.resume()
        self.pushed.append((step, version))
        return version
