"""GRPO groups for ``generate``: n samples per task, reward mean and std, dynamic sampling.

``generate_groups`` runs a batch of tasks n times each through a ``run`` callable (the
engine's), returns one ``Group`` per task with the rewards' mean and (population) std, and,
with dynamic sampling, drops groups whose rewards are all equal (they carry no GRPO
advantage) and tops the batch up: first with tasks past ``batch_size`` in the list, then by
sampling dropped tasks again, until the batch is full or ``max_extra_groups`` more groups
have run. A task sampled again gets new sample indices (attempt k: ``k*n .. k*n+n-1``, after
the task's ``first_index``, which a writing engine moves past what it wrote before), so
(task_id, sample_index) stays unique in the output.

Rewards are any finite floats (-1, 3, sums of step rewards): the figures are scale-free and
nothing is clipped. Whether a group's rewards differ is judged relative to their size
(``SPREAD_TOLERANCE``), so float noise in summed step rewards (0.1 + 0.2 against 0.3) is
no signal, while 100.0 against 100.5 is.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, Field

from rayrollout.data.schema import Task, Trajectory
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.figures import SamplingCounts

__all__ = ["SPREAD_TOLERANCE", "GenerateResult", "Group", "SamplingCounts", "generate_groups"]

RunSpecs = Callable[[list[EpisodeSpec]], Awaitable[list[dict[str, Any]]]]

SPREAD_TOLERANCE = 1e-9
"""A group's rewards differ when their std passes this share of the largest |reward| (at
least 1): float noise of summed rewards is not a GRPO signal."""


class Group(BaseModel):
    """The samples of one task (a GRPO group), in sample order, with their reward figures."""

    task_id: str
    trajectories: list[Trajectory]
    reward_mean: float = Field(description="Mean reward of the group's samples.")
    reward_std: float = Field(description="Population standard deviation of the rewards.")
    attempt: int = Field(default=0, description="0 for the task's first group in the call.")

    @classmethod
    def of(cls, task_id: str, trajectories: list[Trajectory], attempt: int = 0) -> Group:
        trajectories = sorted(trajectories, key=lambda t: t.sample_index)
        rewards = [t.reward for t in trajectories]
        return cls(
            task_id=task_id,
            trajectories=trajectories,
            reward_mean=statistics.fmean(rewards),
            reward_std=statistics.pstdev(rewards),
            attempt=attempt,
        )

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def has_signal(self) -> bool:
        """Whether the rewards differ (a zero-variance group gives every sample advantage 0),
        beyond float noise: see ``SPREAD_TOLERANCE``."""
        largest = max((abs(r) for r in self.rewards), default=0.0)
        return self.reward_std > SPREAD_TOLERANCE * max(1.0, largest)

    def advantages(self, eps: float = 1e-6, scale: bool = True) -> list[float]:
        """GRPO advantages: (reward - mean) / (std + eps), or reward - mean without ``scale``.

        Any finite rewards, negative or large, as they are (no clipping): scaled advantages
        do not depend on the rewards' unit, unscaled ones are in it.
        """
        return [
            (r - self.reward_mean) / (self.reward_std + eps if scale else 1.0) for r in self.rewards
        ]


class GenerateResult(BaseModel):
    """What ``generate`` returns: the kept groups and what dynamic sampling did."""

    groups: list[Group]
    groups_dropped: int = Field(default=0, description="Zero-variance groups left out.")
    extra_groups: int = Field(default=0, description="Groups run beyond the batch to top it up.")
    short_by: int = Field(
        default=0, description="Groups the batch lacks: the extra-group cap or tasks ran out."
    )
    policy_versions: list[int] = Field(
        default_factory=list, description="Versions the returned turns were generated under."
    )
    seconds: float = 0.0

    def trajectories(self) -> list[Trajectory]:
        """Every returned trajectory, group by group."""
        return [t for group in self.groups for t in group.trajectories]


async def generate_groups(
    tasks: list[Task],
    n: int,
    run: RunSpecs,
    dynamic_sampling: bool = False,
    batch_size: int | None = None,
    max_extra_groups: int | None = None,
    first_index: dict[str, int] | None = None,
) -> tuple[GenerateResult, int]:
    """Run ``n`` samples of each task; returns the result and the episodes run.

    Raises:
        ValueError: n < 1 (or < 2 with dynamic sampling), duplicate task ids, bad batch size.
    """
    if n < (2 if dynamic_sampling else 1):
        raise ValueError(
            f"n must be at least {2 if dynamic_sampling else 1}"
            f"{' with dynamic sampling (one sample has no variance)' if dynamic_sampling else ''}"
            f": got {n}"
        )
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"task ids must be unique within one generate() call: {repeated}")
    size = len(tasks) if batch_size is None else batch_size
    if not 1 <= size <= len(tasks):
        raise ValueError(f"batch_size must be between 1 and {len(tasks)} tasks: got {size}")
    budget = size if max_extra_groups is None else max_extra_groups
    started = time.monotonic()
    attempts: dict[str, int] = {}
    first = first_index or {}
    reserve = list(tasks[size:])
    dropped: list[Task] = []  # dropped and not kept since, in the order they were dropped
    kept: list[Group] = []
    groups_dropped = extra = episodes = 0
    pending = list(tasks[:size])
    while pending:
        specs = [
            EpisodeSpec(task, first.get(task.task_id, 0) + attempts.get(task.task_id, 0) * n + i)
            for task in pending
            for i in range(n)
        ]
        rows = await run(specs)
        episodes += len(rows)
        by_task: dict[str, list[Trajectory]] = {t.task_id: [] for t in pending}
        for row in rows:
            trajectory = Trajectory.from_row(row)
            by_task[trajectory.task_id].append(trajectory)
        for task in pending:
            group = Group.of(task.task_id, by_task[task.task_id], attempts.get(task.task_id, 0))
            attempts[task.task_id] = group.attempt + 1
            if dynamic_sampling and not group.has_signal:
                groups_dropped += 1
                if task not in dropped:
                    dropped.append(task)
            else:
                kept.append(group)
                if task in dropped:
                    dropped.remove(task)
        missing = size - len(kept)
        if not dynamic_sampling or missing <= 0 or extra >= budget:
            break
        take = min(missing, budget - extra)
        pending = reserve[:take]
        reserve = reserve[take:]
        # Then sample dropped tasks again, those tried fewest times first.
        retry = sorted(dropped, key=lambda t: attempts[t.task_id])
        pending += retry[: take - len(pending)]
        extra += len(pending)
    versions = sorted(
        {turn.policy_version for g in kept for t in g.trajectories for turn in t.turns}
    )
    result = GenerateResult(
        groups=kept,
        groups_dropped=groups_dropped,
        extra_groups=extra,
        short_by=max(0, size - len(kept)),
        policy_versions=versions,
        seconds=time.monotonic() - started,
    )
    return result, episodes
