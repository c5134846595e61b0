"""A unit of work (``EpisodeSpec``: a task and which of its samples) and the row of one that
could not start.

Apart from the episode loop (``episode_frame``) so that the processes that only queue,
forward and fail specs (the engine actor, the service, the planner) do not import the loop,
its agents and environment sessions.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

from rayrollout.data.schema import Task, Trajectory

__all__ = ["EpisodeSpec", "failed_trajectory", "spec_row"]

_ATTEMPT_IDS = random.Random()
"""This process's own generator of attempt suffixes, seeded from the OS once: ``uuid4``'s
read of the OS's randomness per episode was 3% of a worker's CPU on short episodes, and a
private generator is not replayed by an environment or agent that seeds ``random``."""


class EpisodeSpec:
    """One unit of work: a task and which of its samples to run.

    A spec crosses processes (driver, engine, worker) with its task as pickled bytes, read
    back where the task is first used: the engine actor queues and forwards specs without
    reading their tasks (unpickling and pickling a task's nested row was most of its CPU
    per episode), and a task read in this process is pickled afresh, never from stale bytes.
    """

    __slots__ = ("_blob", "_task", "environment", "queued_at", "sample_index")

    def __init__(self, task: Task, sample_index: int = 0, queued_at: float = 0.0) -> None:
        self._task: Task | None = task
        self._blob = b""  # the task as it arrived, while unread (``_task`` is None)
        self.environment: str = task.environment  # read without the task (the engine's)
        self.sample_index = sample_index
        self.queued_at = queued_at  # Unix time the engine queued it (0: not through the engine)

    @property
    def task(self) -> Task:
        if self._task is None:  # arrived as bytes: read once
            self._task = pickle.loads(self._blob)
            self._blob = b""
        return self._task

    @property
    def key(self) -> tuple[str, int]:
        return (self.task.task_id, self.sample_index)

    def new_episode_id(self) -> str:
        """A unique id for one attempt at this sample (session key for envs and the policy)."""
        return f"{self.task.task_id}:{self.sample_index}:{_ATTEMPT_IDS.getrandbits(32):08x}"

    def __reduce__(self) -> tuple[Any, ...]:
        blob = self._blob if self._task is None else pickle.dumps(self._task, protocol=5)
        return (_arrived, (blob, self.environment, self.sample_index, self.queued_at))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EpisodeSpec):
            return NotImplemented
        return (self.task, self.sample_index, self.queued_at) == (
            other.task,
            other.sample_index,
            other.queued_at,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return (
            f"EpisodeSpec(task={self.task!r}, sample_index={self.sample_index!r}, "
            f"queued_at={self.queued_at!r})"
        )


def _arrived(blob: bytes, environment: str, sample_index: int, queued_at: float) -> EpisodeSpec:
    """A spec unpickled in this process: its task stays bytes until first read."""
    spec = EpisodeSpec.__new__(EpisodeSpec)
    spec._task, spec._blob, spec.environment = None, blob, environment
    spec.sample_index, spec.queued_at = sample_index, queued_at
    return spec


def failed_trajectory(
    spec: EpisodeSpec, worker_name: str, error: str, played_by: str = ""
) -> Trajectory:
    """The row of an episode that could not even start."""
    return spec_row(
        spec, worker_name, played_by, messages=list(spec.task.prompt), status="error", error=error
    )


def spec_row(spec: EpisodeSpec, worker_name: str, played_by: str, **fields: Any) -> Trajectory:
    """A row of ``spec``'s task and sample (its group is the task), played by ``played_by``
    on ``worker_name``, with ``fields`` besides."""
    task = spec.task
    return Trajectory(
        task_id=task.task_id,
        sample_index=spec.sample_index,
        group_id=task.task_id,
        environment=task.environment,
        worker=worker_name,
        played_by=played_by,
        task_fields=task.fields,
        **fields,
    )
