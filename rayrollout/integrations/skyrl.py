"""SkyRL's generator, played by rayrollout: ``RayrolloutGenerator`` is a SkyRL
``GeneratorInterface`` whose ``generate`` is one rayrollout batch over HTTP.

Each instance goes once with ``n`` samples (a GRPO group); the answer keeps SkyRL's order,
the engine's token ids and a policy-token mask. A failed episode keeps its place with a mask
of zeros; more than ``max_failed_fraction`` failing raises.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rayrollout.client import AsyncRolloutClient
from rayrollout.integrations.sequences import (
    Sequence,
    TooManyFailuresError,
    check_failures,
    flatten,
    group_rows,
    task_row,
)

try:
    from skyrl.train.generators.base import (
        GeneratorInput,
        GeneratorInterface,
        GeneratorOutput,
        TrajectoryID,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rayrollout.integrations.skyrl needs SkyRL: pip install skyrl==0.4.0 (Python 3.12)"
    ) from exc

__all__ = ["RayrolloutGenerator", "TooManyFailuresError"]

# SkyRL's sampling keys -> rayrollout's task-row ``sampling`` keys.
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_generate_length": "max_tokens",
    "max_tokens": "max_tokens",
    "seed": "seed",
}


class RayrolloutGenerator(GeneratorInterface):
    """A SkyRL generator whose batches rayrollout plays.

    Args:
        client: The rollout service's async client (``AsyncRolloutClient(url, token=...)``).
        environments: SkyRL ``env_class`` -> rayrollout environment name; a class not named
            here is sent as is (``None`` leaves the run's default environment).
        max_failed_fraction: Raise ``TooManyFailuresError`` when more of a batch failed.
        mask_forced: Leave the tokens a constraint forced out of ``loss_masks`` (False
            keeps them).
    """

    def __init__(
        self,
        client: AsyncRolloutClient,
        environments: dict[str, str] | None = None,
        max_failed_fraction: float = 0.5,
        mask_forced: bool = True,
    ) -> None:
        self.client = client
        self.mask_forced = mask_forced
        self.environments = environments or {}
        self.max_failed_fraction = max_failed_fraction
        self.last_failures: list[Sequence] = []
        self.last_sequences: list[Sequence] = []

    def tasks(self, input_batch: GeneratorInput) -> tuple[list[dict[str, Any]], int]:
        """Each instance once, as a rayrollout task row, and the samples per instance."""
        prompts = input_batch["prompts"]
        ids = input_batch.get("trajectory_ids") or [
            TrajectoryID(instance_id=str(i), repetition_id=0) for i in range(len(prompts))
        ]
        extras = input_batch.get("env_extras") or [{} for _ in prompts]
        env_classes = input_batch.get("env_classes") or [None] * len(prompts)
        sampling = {
            SAMPLING_KEYS[k]: v
            for k, v in (input_batch.get("sampling_params") or {}).items()
            if k in SAMPLING_KEYS and v is not None
        }
        rows: dict[str, dict[str, Any]] = {}
        counts: Counter[str] = Counter()
        for prompt, tid, extra, env in zip(prompts, ids, extras, env_classes, strict=True):
            counts[tid.instance_id] += 1
            if tid.instance_id in rows:
                continue
            fields = {k: v for k, v in (extra or {}).items() if v is not None}
            if sampling:
                fields["sampling"] = {**sampling, **fields.get("sampling", {})}
            environment = self.environments.get(env, env) if env else None
            rows[tid.instance_id] = task_row(tid.instance_id, prompt, environment, fields)
        sizes = set(counts.values())
        if len(sizes) != 1:
            raise ValueError(
                f"every instance needs the same number of repetitions, got {dict(counts)}"
            )
        return list(rows.values()), sizes.pop()

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        tasks, n = self.tasks(input_batch)
        batch = await self.client.submit(tasks, n=n)
        groups = group_rows(await self.client.wait(batch.batch_id))
        ids = input_batch.get("trajectory_ids") or [
            TrajectoryID(instance_id=str(i), repetition_id=0)
            for i in range(len(input_batch["prompts"]))
        ]
        repetitions: dict[str, list[int]] = {}
        for tid in ids:
            repetitions.setdefault(tid.instance_id, []).append(tid.repetition_id)
        sequences = []
        for tid in ids:
            position = sorted(repetitions[tid.instance_id]).index(tid.repetition_id)
            sequences.append(flatten(groups[tid.instance_id][position], self.mask_forced))
        self.last_sequences = sequences
        self.last_failures = check_failures(sequences, self.max_failed_fraction)
        versions = [v for s in sequences for v in s.policy_versions]
        output: GeneratorOutput = {
            "prompt_token_ids": [s.prompt_ids for s in sequences],
            "response_ids": [s.response_ids for s in sequences],
            "rewards": [float(s.reward) for s in sequences],
            "loss_masks": [s.mask for s in sequences],
            "stop_reasons": [s.stop_reason for s in sequences],
            "rollout_metrics": {
                "rayrollout/failed_episodes": len(self.last_failures),
                "rayrollout/mean_turns": sum(s.num_turns for s in sequences) / len(sequences),
                "rayrollout/oldest_policy_version": min(versions, default=0),
            },
            "rollout_logprobs": [s.logprobs for s in sequences],
            # Aligned with response_ids, as rollout_logprobs: -1 on environment tokens.
            "rayrollout_token_versions": [s.token_versions for s in sequences],
            "trajectory_ids": list(ids),
        }
        return output
