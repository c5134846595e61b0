"""verl rows (``docs/preparation/prepare_data.rst``): one row per task, prompts for verl to
roll out itself.

Each row has ``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model``
``{"style": "rule", "ground_truth": ...}`` and ``extra_info``.
"""

from __future__ import annotations

import json
from typing import Any

from rayrollout.data.export.base import ExportError
from rayrollout.data.export.trl import split_prompt, tools_text
from rayrollout.data.schema import Trajectory

__all__ = ["verl_row"]

# Task fields that hold the reference answer, in the order they are looked for.
_ANSWER_FIELDS = ("expected_answer", "ground_truth", "reference_answer", "answer")


def verl_row(
    trajectory: Trajectory, index: int, samples: int = 1, mean_reward: float | None = None
) -> dict[str, Any]:
    """One verl RL row for the trajectory's task: its prompt and how to score answers to it.

    ``ground_truth`` is the task's reference answer (``expected_answer``, ``ground_truth``,
    ``reference_answer`` or ``answer``) as text, else all its verifier fields as JSON text,
    for a custom verl reward function; ``extra_info`` adds how the task fared here.
    """
    prompt, _ = split_prompt(trajectory)
    if any(m.images for m in prompt):  # a text prompt would lose the picture it asks about
        raise ExportError(
            f"task '{trajectory.task_id}' sample {trajectory.sample_index}, field 'messages': "
            "its prompt shows images, and the verl export writes text prompts only"
        )
    fields = {
        k: v
        for k, v in trajectory.task_fields.items()
        if k not in ("responses_create_params", "agent_ref")
    }
    return {
        "data_source": trajectory.environment,
        "prompt": [{"role": m.role, "content": m.content or ""} for m in prompt],
        "ability": trajectory.environment,
        "reward_model": {"style": "rule", "ground_truth": _ground_truth(fields)},
        "extra_info": {
            "index": index,
            "task_id": trajectory.task_id,
            "environment": trajectory.environment,
            "samples": samples,
            "mean_reward": trajectory.reward if mean_reward is None else mean_reward,
            "tools": tools_text(trajectory.tools) or "",
            "fields": json.dumps(fields, ensure_ascii=False, default=str),
        },
    }


def _ground_truth(fields: dict[str, Any]) -> str:
    for name in _ANSWER_FIELDS:
        if name in fields:
            value = fields[name]
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return json.dumps(fields, ensure_ascii=False, default=str) if fields else ""
