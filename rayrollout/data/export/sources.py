"""Row sources, one per export kind: a run folder in, the kind's rows out, as a stream.

SFT and NeMo Gym rows need one pass. DPO pairs and verl's per-task rows need every sample
of a task first: a first pass (``reading.groups``) keeps a few numbers per task, and a
second pass converts only the rows it picked, so memory does not grow with the folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rayrollout.data.export import reading
from rayrollout.data.export.base import ExportError, ExportSummary
from rayrollout.data.export.nemo_gym import (
    VERIFIED,
    nemo_gym_failure_row,
    nemo_gym_input_row,
    nemo_gym_row,
)
from rayrollout.data.export.trl import dpo_row, sft_row
from rayrollout.data.export.verl import verl_row
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Trajectory

__all__ = ["dpo_rows", "nemo_gym_rows", "sft_rows", "verl_rows"]

# Rewards are floats: 0.7 - 0.2 is 0.49999999999999994, which a 0.5 gap should still take.
_GAP_TOLERANCE = 1e-9


def sft_rows(
    folder: RunFolder, counts: ExportSummary, min_reward: float
) -> Iterator[dict[str, Any]]:
    """SFT rows of the ``ok`` trajectories with at least ``min_reward``."""
    for where, row in reading.rows(folder):
        counts.rows_read += 1
        if row.get("status") == "ok" and reading.number(where, row, "reward") >= min_reward:
            yield sft_row(reading.trajectory(where, row))


def dpo_rows(folder: RunFolder, counts: ExportSummary, min_gap: float) -> Iterator[dict[str, Any]]:
    """One DPO pair per task: its best and worst ``ok`` samples, when ``min_gap`` apart."""
    picked: dict[tuple[str, int], str] = {}
    for task_id, group in reading.groups(folder, counts).items():
        best, worst = group.best, group.worst
        if not best or not worst or best[1] == worst[1]:
            continue
        if best[0] - worst[0] >= min_gap - _GAP_TOLERANCE:
            picked[(task_id, best[1])] = "chosen"
            picked[(task_id, worst[1])] = "rejected"
    # A pair's two rows may sit in different parts: hold the first half until the second.
    halves: dict[str, dict[str, Trajectory]] = {}
    for where, row in reading.rows(folder):
        side = picked.get((str(row.get("task_id")), int(row.get("sample_index") or 0)))
        if side is None:
            continue
        episode = reading.trajectory(where, row)
        pair = halves.setdefault(episode.task_id, {})
        pair[side] = episode
        if len(pair) == 2:
            del halves[episode.task_id]
            yield dpo_row(pair["chosen"], pair["rejected"])


def nemo_gym_rows(folder: RunFolder, counts: ExportSummary) -> Iterator[tuple[str, dict[str, Any]]]:
    """(file, row) for the three NeMo Gym files: every episode's input row, then its
    rollout row if it was verified, else its failure row.

    Tasks are numbered in the order they first appear. NeMo Gym keys rows by (task index,
    rollout index) and its profiler rejects a key seen twice, so a second row for the same
    task and sample (two runs' parts in one folder) is an error here; the keys are the only
    per-row state kept.
    """
    task_index: dict[str, int] = {}
    seen: dict[str, set[int]] = {}
    for where, row in reading.rows(folder):
        counts.rows_read += 1
        episode = reading.trajectory(where, row)
        samples = seen.setdefault(episode.task_id, set())
        if episode.sample_index in samples:
            raise ExportError(
                f"{where}: task '{episode.task_id}' sample {episode.sample_index} is "
                "already in an earlier row; NeMo Gym needs one row per task and sample (is the "
                "folder two runs' parts?)"
            )
        samples.add(episode.sample_index)
        index = task_index.setdefault(episode.task_id, len(task_index))
        counts.tasks = len(task_index)
        yield "inputs", nemo_gym_input_row(episode, index)
        if episode.status in VERIFIED:
            yield "rollouts", nemo_gym_row(episode, index)
        else:
            yield "failures", nemo_gym_failure_row(episode, index)


def verl_rows(folder: RunFolder, counts: ExportSummary) -> Iterator[dict[str, Any]]:
    """One verl row per task, with how many samples it had here and their mean reward."""
    groups = reading.groups(folder, counts)
    seen: set[str] = set()
    for where, row in reading.rows(folder):
        task_id = str(row.get("task_id"))
        if task_id in seen:
            continue
        seen.add(task_id)
        group = groups[task_id]
        yield verl_row(
            reading.trajectory(where, row),
            len(seen) - 1,
            group.samples,
            group.reward_sum / group.samples,
        )
