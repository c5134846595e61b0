"""Exports: a run's output folder as training data for SFT, DPO, NeMo Gym and verl.

Each format is one small function from trajectories to a row (``trl``, ``nemo_gym``,
``verl``); ``export_run`` (``run``) streams the folder's parts through one of them into a
``.jsonl`` or ``.parquet`` file (``reading``, ``sources``, ``writing``). Rewards go in as
they are; ``min_reward`` and ``min_gap`` are thresholds in the rewards' own unit.

May import: ``rayrollout.data`` only (the export runs without Ray).
"""

from rayrollout.data.export.base import KINDS, ExportError, ExportSummary
from rayrollout.data.export.nemo_gym import (
    nemo_gym_failure_row,
    nemo_gym_files,
    nemo_gym_input_row,
    nemo_gym_row,
)
from rayrollout.data.export.reading import part_files
from rayrollout.data.export.run import SUFFIXES, export_run
from rayrollout.data.export.trl import chat_message, dpo_row, sft_row, split_prompt
from rayrollout.data.export.verl import verl_row

__all__ = [
    "KINDS",
    "SUFFIXES",
    "ExportError",
    "ExportSummary",
    "chat_message",
    "dpo_row",
    "export_run",
    "nemo_gym_failure_row",
    "nemo_gym_files",
    "nemo_gym_input_row",
    "nemo_gym_row",
    "part_files",
    "sft_row",
    "split_prompt",
    "verl_row",
]
