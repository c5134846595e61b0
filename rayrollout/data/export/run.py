"""``export_run``: the entry point that checks the options, streams a run folder through
one kind's row source and puts the files in place whole."""

from __future__ import annotations

import math
import os
from pathlib import Path

from rayrollout.data.export import sources
from rayrollout.data.export.base import KINDS, ExportError, ExportSummary
from rayrollout.data.export.nemo_gym import nemo_gym_files
from rayrollout.data.export.reading import open_folder
from rayrollout.data.export.writing import (
    SCHEMAS,
    LateImages,
    with_images,
    write_routed,
    write_rows,
)

__all__ = ["SUFFIXES", "export_run"]

SUFFIXES = (".jsonl", ".parquet")


def export_run(
    kind: str,
    source: str | Path,
    out: str | Path,
    *,
    min_reward: float = 1.0,
    min_gap: float = 0.5,
) -> ExportSummary:
    """Export a run's output folder as ``kind`` rows to ``out`` (``.jsonl`` or ``.parquet``).

    Args:
        kind: ``sft``, ``dpo``, ``nemo-gym`` or ``verl``.
        source: The output folder of ``rayrollout collect`` (Parquet or JSONL parts).
        out: The file to write; written to a hidden temporary file and renamed into place,
            so a failed export leaves no partial file. ``nemo-gym`` also writes
            ``<stem>_failures.jsonl`` and ``<stem>_materialized_inputs.jsonl`` beside it
            (``nemo_gym_files``), the same way.
        min_reward: ``sft``: keep trajectories with status ``ok`` and at least this reward
            (rewards are any finite float; 1.0 is a success where success scores 1).
        min_gap: ``dpo``: pair a task's best and worst ``ok`` samples when their rewards
            differ by at least this much (one pair per task); any positive number, in the
            rewards' unit.

    Raises:
        ExportError: a bad option, a missing or empty folder, a bad row (named by file and
            line or row and field), or nothing to export.

    Example:
        >>> export_run("dpo", "rollouts/run1", "pairs.parquet", min_gap=0.5)  # doctest: +SKIP
    """
    out = Path(out)
    if kind not in KINDS:
        raise ExportError(f"unknown export {kind!r}; use one of {', '.join(KINDS)}")
    if out.suffix not in SUFFIXES:
        raise ExportError(f"OUT must end in .jsonl or .parquet, got {out.name!r}")
    if out.suffix == ".parquet" and kind not in SCHEMAS:
        raise ExportError(
            f"{kind} rows are JSONL (NeMo Gym reads and writes rollouts as JSONL); "
            f"name OUT {out.with_suffix('.jsonl').name!r}"
        )
    # Rewards are any finite float (-1, 3, sums of step rewards), so the gap is any positive
    # number in the rewards' own unit; neither threshold clips a reward.
    if not (math.isfinite(min_gap) and min_gap > 0.0):
        raise ExportError(
            f"--min-gap must be a positive number (a reward gap, in the rewards' unit), "
            f"got {min_gap}"
        )
    if not math.isfinite(min_reward):
        raise ExportError(f"--min-reward must be a finite number, got {min_reward}")
    folder = open_folder(source)
    counts = ExportSummary(kind=kind, out=out)
    targets = nemo_gym_files(out) if kind == "nemo-gym" else {"main": out}
    temporaries = {name: path.with_name(f".{path.name}.tmp") for name, path in targets.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "nemo-gym":
            written = write_routed(sources.nemo_gym_rows(folder, counts), temporaries)
            counts.rows_written, counts.failures_written = written["rollouts"], written["failures"]
        else:
            rows = {
                "sft": lambda: sources.sft_rows(folder, counts, min_reward),
                "dpo": lambda: sources.dpo_rows(folder, counts, min_gap),
                "verl": lambda: sources.verl_rows(folder, counts),
            }[kind]
            schema = SCHEMAS.get(kind)
            try:
                counts.rows_written = write_rows(rows(), temporaries["main"], out.suffix, schema)
            except LateImages:  # images only after the first batch: again, with the column
                assert schema is not None
                counts = ExportSummary(kind=kind, out=out)
                counts.rows_written = write_rows(
                    rows(), temporaries["main"], out.suffix, with_images(schema)
                )
        if counts.rows_written == 0:
            raise ExportError(_nothing_to_export(kind, Path(source), counts, min_reward, min_gap))
        # OUT last: where it exists, the files beside it are whole too.
        for name in sorted(targets, key=lambda name: targets[name] == out):
            os.replace(temporaries[name], targets[name])
    finally:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)
    counts.files = list(targets.values())
    return counts


def _nothing_to_export(
    kind: str, source: Path, counts: ExportSummary, min_reward: float, min_gap: float
) -> str:
    if counts.rows_read == 0:
        return f"the part files in {source} hold no rows"
    why = {
        "sft": f"has status 'ok' and reward >= {min_reward}; lower --min-reward",
        "nemo-gym": (
            f"was verified (status ok, max_turns or truncated); {counts.failures_written} "
            "failed (NeMo Gym fails a collection with no verified rollout too)"
        ),
    }
    if kind == "dpo":
        return (
            f"none of the {counts.tasks} task(s) in {source} has two 'ok' samples whose "
            f"rewards differ by >= {min_gap}; lower --min-gap, or collect more samples per "
            "task (--num-repeats)"
        )
    return f"none of the {counts.rows_read} trajectories in {source} {why[kind]}"
