"""reasoning-gym: procedurally generated reasoning tasks, scored by the package's own scorer.

Tasks come from ``reasoning_gym``'s generators (a dataset name, a seed and a size give the
same tasks every time): ``generate_tasks`` writes them as rayrollout task rows, and
``rayrollout env tasks reasoning_gym --dataset leg_counting --size 20 --seed 1`` prints them
as JSONL. Each row keeps the generator's ``answer`` and ``metadata``, so the verifier can
call that dataset's ``score_answer`` on the model's final answer (the text inside
``<answer>...</answer>`` when present, else the whole answer). No tools: the model reasons
and answers.

Needs the optional extra: ``pip install 'rayrollout[reasoning-gym]'``.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

from rayrollout.envkit import Environment, Episode, Verification

SYSTEM_PROMPT = (
    "Think the problem through, then give your final answer inside <answer></answer> tags, "
    "e.g. <answer>42</answer>."
)
INSTALL_HINT = "reasoning-gym is not installed: pip install 'rayrollout[reasoning-gym]'"


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return reasoning_gym


@functools.cache
def _scorer(dataset: str) -> Callable[[str, dict[str, Any]], float]:
    return _reasoning_gym().get_score_answer_fn(dataset)


def generate_tasks(dataset: list[str] | str, size: int = 10, seed: int = 0) -> Iterator[dict]:
    """Task rows from reasoning-gym's generators: ``size`` per dataset, reproducible by seed.

    Example::

        rows = list(generate_tasks(["leg_counting"], size=20, seed=1))
    """
    rg = _reasoning_gym()
    for name in [dataset] if isinstance(dataset, str) else dataset:
        try:
            data = rg.create_dataset(name, size=size, seed=seed)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"unknown reasoning-gym dataset {name!r}: {exc}") from None
        for index, entry in enumerate(data):
            yield {
                "task_id": f"rg-{name}-{seed}-{index}",
                "environment": ReasoningGymEnv.name,
                "prompt": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": entry["question"]},
                ],
                "dataset": name,
                "answer": entry["answer"],
                # JSON-safe (tuples become lists), as it will be once it has been a file.
                "metadata": json.loads(json.dumps(entry.get("metadata", {}), default=str)),
            }


def extract_answer(text: str) -> str:
    """The text inside the last ``<answer>...</answer>``, else the whole text, stripped."""
    head, sep, tail = text.rpartition("<answer>")
    if sep:
        return tail.partition("</answer>")[0].strip()
    return text.strip()


class ReasoningGymEnv(Environment):
    """Scores final answers with reasoning-gym's ``score_answer`` of the task's dataset."""

    name = "reasoning_gym"
    default_hosting = "inline"  # scoring is light; it runs in a thread off the agent's loop

    @classmethod
    def generate_tasks(
        cls, dataset: list[str] | str, size: int = 10, seed: int = 0
    ) -> Iterator[dict]:
        """Task rows from reasoning-gym's generators (``rayrollout env tasks`` calls this)."""
        return generate_tasks(dataset, size=size, seed=seed)

    async def verify(self, episode: Episode) -> Verification:
        """Reward: the dataset's own ``score_answer`` of the extracted answer, in [0, 1]."""
        fields = self.task.fields
        if "dataset" not in fields or "answer" not in fields:
            raise ValueError(
                "a reasoning_gym task needs 'dataset' and 'answer' fields: generate tasks with "
                "`rayrollout env tasks reasoning_gym --dataset NAME`"
            )
        question = next((m.content for m in reversed(self.task.prompt) if m.role == "user"), "")
        entry = {
            "question": question,
            "answer": fields["answer"],
            "metadata": fields.get("metadata") or {},
        }
        answer = extract_answer(episode.final_answer())
        scorer = _scorer(fields["dataset"])
        score = await asyncio.to_thread(scorer, answer, entry)
        reward = min(1.0, max(0.0, float(score or 0.0)))
        return Verification(
            reward=reward,
            details={"dataset": fields["dataset"], "extracted_answer": answer},
        )
