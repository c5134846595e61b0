"""``rayrollout show``, ``report`` and ``export``: a finished run's output folder read back, as
a conversation on the terminal, an HTML page, or training data. No Ray needed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rayrollout.cli.common import console, fail
from rayrollout.cli.show_command import show

__all__ = ["export", "report", "show"]

RunFolderArgument = Annotated[Path, typer.Argument(help="Output folder of a run.")]


def report(
    directory: RunFolderArgument,
    html_path: Annotated[Path, typer.Option("--html", help="Where to write the page.")] = Path(
        "report.html"
    ),
) -> None:
    """Write one self-contained HTML page (plots embedded) describing a run's output."""
    from rayrollout.cli.report import render_report

    try:
        page = render_report(directory)
    except FileNotFoundError as exc:  # no such folder, or no parts in it
        fail(str(exc), 1)
    html_path.write_text(page, encoding="utf-8")
    console.print(f"wrote {html_path} ({len(page) // 1024} KiB)", soft_wrap=True)


def export(
    kind: Annotated[str, typer.Argument(help="sft, dpo, nemo-gym or verl.")],
    source: Annotated[
        Path, typer.Argument(help="Output folder of a run (Parquet or JSONL parts).")
    ],
    out: Annotated[
        Path,
        typer.Argument(
            help="File to write: .jsonl or .parquet (by suffix). nemo-gym also writes "
            "<stem>_failures.jsonl (failed episodes) and <stem>_materialized_inputs.jsonl "
            "beside it, as NeMo Gym's rollout collection does."
        ),
    ],
    min_reward: Annotated[
        float, typer.Option("--min-reward", help="sft: least reward of an 'ok' trajectory kept.")
    ] = 1.0,
    min_gap: Annotated[
        float,
        typer.Option("--min-gap", help="dpo: least reward gap between chosen and rejected."),
    ] = 0.5,
) -> None:
    """Write a run's trajectories as training data: TRL SFT or DPO rows, NeMo Gym rollouts, verl."""
    from rayrollout.data.export import export_run, nemo_gym_files

    summary = export_run(kind, source, out, min_reward=min_reward, min_gap=min_gap)
    console.print(
        f"wrote {summary.rows_written} {kind} row(s) to {out} "
        f"({summary.rows_read} trajectories read from {source})",
        highlight=False,
        soft_wrap=True,  # unwrapped: the paths stay whole, to copy
    )
    if kind == "nemo-gym":
        files = nemo_gym_files(out)
        console.print(
            f"and {summary.failures_written} failed episode(s) to {files['failures']}, the "
            f"inputs to {files['inputs']} (NeMo Gym's rollout files)",
            highlight=False,
            soft_wrap=True,
        )
