"""Exports: a run's output folder as training data for SFT, DPO, NeMo Gym and verl.

Each format is one small function from trajectories to a row (``sft_row``, ``dpo_row``,
``nemo_gym_row``, ``verl_row``); ``export_run`` streams the folder's part files through one
of them into a ``.jsonl`` or ``.parquet`` file. One job per module:

* ``base``: the kinds, ``ExportError`` and ``ExportSummary``;
* ``trl``: TRL's SFT and DPO rows, and the split of an episode into prompt and the rest;
* ``nemo_gym``: the rows of NeMo Gym's three rollout files;
* ``verl``: verl's per-task prompt rows;
* ``reading``: rows of the run folder (through ``RunFolder``) and the first pass over a
  task's samples;
* ``sources``: one row source per kind, from the folder to a stream of rows;
* ``writing``: JSONL lines or Parquet row groups of a fixed schema per kind;
* ``run``: ``export_run``, which checks the options and puts the files in place whole.

Each format module's docstring says where its shape comes from (the project's docs and
source); the tests check the rows the way those projects' readers read them.

Rewards go into every format as they are, any finite float (-1, 3, a sum of step rewards);
TRL, verl and NeMo Gym all read a reward as a plain float. The two options that need a
scale are thresholds in the rewards' own unit: ``min_reward`` (``sft``, default 1.0) and
``min_gap`` (``dpo``, any positive number).

May import: ``rayrollout.data`` only (the export runs without Ray).

Example:
    >>> from rayrollout.data.export import export_run
    >>> export_run("sft", "rollouts/run1", "sft.jsonl", min_reward=1.0)  # doctest: +SKIP
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
