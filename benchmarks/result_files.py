"""The benchmarks' result files: one run kept, N runs in a row kept as one series, read back.

A result file is ``results/<name>.json`` (a ``--smoke`` run's: ``<name>.smoke.json``), one
record per run, so that the docs pool a figure over its runs and never show a smoke run as
a measurement (``table.py``). One run never replaces a series of several
(``<name>.single.json`` keeps it instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
"""Where each benchmark keeps its latest result; docs/gen_reference.py builds the docs'
table of figures against targets (``targets.py``) from these files."""

RESULTS_ENV = "RAYROLLOUT_BENCHMARK_RESULTS"
"""A folder to write results to instead of ``RESULTS``: how ``--runs N`` collects its runs
(and how tests keep theirs out of ``benchmarks/results/``)."""

SERIES_RUN_ENV = "RAYROLLOUT_BENCHMARK_SERIES_RUN"
"""Set by ``--runs N`` for each of its runs: ``<number>:<results folder>``, the run's number
in the series and the folder whose result file the series will replace (``earlier_record``)."""

RUNS_HELP = (  # aligned with argparse's own option help
    "  --runs N              run the benchmark N times in a row, each in its own process,\n"
    "                        and keep the N runs as one result (the docs pool a figure\n"
    "                        over at least 3 runs)"
)


def results_dir() -> Path:
    """``RESULTS``, or the folder ``RAYROLLOUT_BENCHMARK_RESULTS`` names."""
    return Path(os.environ.get(RESULTS_ENV) or RESULTS)


def result_path(name: str, smoke: bool) -> Path:
    """``results/<name>.json``, or ``<name>.smoke.json`` for a ``--smoke`` run, so that CI's
    smoke runs never replace a full run's figures."""
    return results_dir() / f"{name}{'.smoke' if smoke else ''}.json"


def this_command(arguments: list[str] | None = None) -> str:
    """The command line of this run: the script and its arguments, so a figure can be
    reproduced."""
    script = Path(sys.argv[0]).name
    arguments = sys.argv[1:] if arguments is None else arguments
    return " ".join(["python", f"benchmarks/{script}", *arguments])


def _write_whole(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to a temporary file and rename it into place, so a reader never
    sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temp, path)


def save_result(result: dict[str, Any], name: str | None = None) -> Path:
    """Keep ``result`` as the benchmark's latest result, a series of one run; returns the path.
    Where the result file keeps a series of several runs (``--runs N``), the run goes beside
    it (``single_path``): a profiling run with other options must not replace pooled figures.

    A result file is ``{"command", "smoke", "runs": [record, ...]}``: the command that
    produced it and one record per run (``--runs N`` keeps N), each the benchmark's JSON with
    its own ``command``, ``load_average_1m`` and ``finished_at`` (UTC). The name is the
    script's (``overhead.py`` -> ``overhead``) unless given.
    """
    name = name or Path(sys.argv[0]).stem
    smoke = "--smoke" in sys.argv[1:]
    command = this_command()
    record = {
        "command": command,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **result,
    }
    path = result_path(name, smoke)
    pooled = 0 if smoke else _runs_kept(path)
    if pooled > 1:  # the docs pool that series: one run beside it, never in its place
        path = single_path(name)
        print(
            f"{result_path(name, smoke)} keeps a series of {pooled} runs, which one run does "
            f"not replace (a series does: --runs N); this run is in {path}",
            file=sys.stderr,
        )
    _write_whole(path, {"command": command, "smoke": smoke, "runs": [record]})
    return path


def single_path(name: str) -> Path:
    """Where one full run goes when ``<name>.json`` keeps a series of several: beside it,
    out of the docs' table and of git (``.gitignore``)."""
    return results_dir() / f"{name}.single.json"


def _runs_kept(path: Path) -> int:
    """How many runs the result file at ``path`` keeps (0: none, or not a series)."""
    try:
        return len(read_series(path)["runs"])
    except (OSError, ValueError):
        return 0


class ResultFileError(ValueError):
    """A result file that the docs' table cannot stand on, with what is wrong and the fix."""


def read_series(path: Path) -> dict[str, Any]:
    """A result file's series (``save_result``), checked: a file of full runs holds no smoke
    run, so a smoke figure can never stand as the latest.

    Raises:
        ResultFileError: the file is not a series, or mixes smoke and full runs.
    """
    data = json.loads(path.read_text())
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise ResultFileError(
            f"{path}: not a result series ({{'command', 'smoke', 'runs': [...]}}); rerun the "
            "benchmark to write it (result_files.save_result)"
        )
    smoke_file = path.name.endswith(".smoke.json")
    for index, record in enumerate(runs):
        smoke = bool(record.get("smoke")) or "--smoke" in str(record.get("command", "")).split()
        if smoke != smoke_file or bool(data.get("smoke")) != smoke_file:
            where = "a smoke run in a full result" if smoke else "a full run in a smoke result"
            raise ResultFileError(
                f"{path}: runs[{index}] ({record.get('command')!r}) is {where}: smoke runs go "
                "to <name>.smoke.json only; rerun the benchmark to replace the file"
            )
    return data


def earlier_record(name: str, smoke: bool) -> dict[str, Any] | None:
    """The record this run follows in the benchmark's result file, or None without one.

    Outside a series it is the file's newest record. Run *i* of a series (``--runs N``)
    follows run *i* of the series its result will replace, so that parts a benchmark keeps
    from an earlier result (``task_scale.py --cases``) stay as many runs as were measured,
    never one run copied into each."""
    series_run = os.environ.get(SERIES_RUN_ENV)
    if not series_run:
        path = result_path(name, smoke)
        return read_series(path)["runs"][-1] if path.exists() else None
    number, _, folder = series_run.partition(":")
    path = Path(folder) / result_path(name, smoke).name
    runs = read_series(path)["runs"] if path.exists() else []
    return runs[int(number) - 1] if int(number) <= len(runs) else None


def _runs_argument(arguments: list[str]) -> tuple[int | None, list[str]]:
    """``--runs N`` (or ``--runs=N``) taken out of ``arguments``: (N or None, the rest)."""
    rest, runs, items = [], None, iter(arguments)
    for item in items:
        if item == "--runs" or item.startswith("--runs="):
            value = item.partition("=")[2] or next(items, "")
            if not value.isdigit() or int(value) < 1:
                raise SystemExit(f"--runs takes a whole number of runs >= 1, not {value!r}")
            runs = int(value)
        else:
            rest.append(item)
    return runs, rest


def run_benchmark(main: Callable[[], None]) -> None:
    """Run a benchmark's ``main`` once, or ``--runs N`` times in a row as one series.

    Each run is the script in its own process (as a fresh command would be), writing its
    result to a temporary folder; the N records then go to the result file together, and
    stdout holds that one series. A failed run keeps nothing: a series is N runs in a row.
    """
    runs, rest = _runs_argument(sys.argv[1:])
    if "-h" in rest or "--help" in rest:
        try:
            main()
        finally:
            print(RUNS_HELP)
    if runs is None:
        main()
        return
    series: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="benchmark-runs-") as folder:
        for number in range(1, runs + 1):
            print(f"run {number} of {runs}: {this_command(rest)}", file=sys.stderr)
            done = subprocess.run(
                [sys.executable, sys.argv[0], *rest],
                env={
                    **os.environ,
                    RESULTS_ENV: folder,
                    SERIES_RUN_ENV: f"{number}:{results_dir()}",
                },
                stdout=subprocess.DEVNULL,
            )
            if done.returncode:
                raise SystemExit(
                    f"run {number} of {runs} failed (exit {done.returncode}); no run of this "
                    "series is kept: fix the failure and run the series again"
                )
            for path in sorted(Path(folder).glob("*.json")):
                series.setdefault(path.name, []).extend(read_series(path)["runs"])
                path.unlink()
    command = this_command()
    kept = {}
    for file_name, records in series.items():
        data = {"command": command, "smoke": file_name.endswith(".smoke.json"), "runs": records}
        _write_whole(results_dir() / file_name, data)
        kept[file_name] = data
    print(json.dumps(kept[next(iter(kept))] if len(kept) == 1 else kept, indent=2))
