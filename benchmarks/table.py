"""The docs' tables of benchmark figures, from the full runs in ``results/`` and ``targets.py``.

``docs/gen_reference.py`` writes them into ``docs/reference/benchmarks.md`` and the scaling
section of ``docs/explanation/performance.md``. Only full runs are read (a smoke run only
checks that a benchmark works), every measured figure is pooled over its runs (``pool``),
and a figure stands beside its lowest and highest run and its noise floor.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from result_files import read_series
from targets import MIN_RUNS, NOISE_FLOOR_COMMANDS, TARGETS, Pooled, Target, pool

__all__ = ["full_runs", "lookup", "scaling_table", "targets_table"]

HEADER = (
    "| benchmark | figure | target | pooled | lowest – highest run | runs | met | "
    "noise floor | measured by |"
)


def cell(text: object) -> str:
    """``text`` as one Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    """``text`` as inline code in a table cell (backticks inside it doubled around)."""
    value = cell(text)
    return f"`` {value} ``" if "`" in value else f"`{value}`"


def lookup(result: Any, field: str) -> Any:
    """The value at ``field`` (``targets.py``'s path syntax); KeyError when it is not there."""
    values = [result]
    for part in _split_path(field):
        found = []
        for value in values:
            if part == "*":
                if not isinstance(value, dict):
                    raise KeyError(field)
                found += list(value.values())
            elif part.startswith("[") and part.endswith("]"):
                key, _, wanted = part[1:-1].partition("=")
                items = [
                    item
                    for item in value
                    if isinstance(item, dict) and str(item.get(key)) == wanted
                ]
                if not items:
                    raise KeyError(field)
                found.append(items[0])
            else:
                if not isinstance(value, dict) or part not in value:
                    raise KeyError(field)
                found.append(value[part])
        values = found
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(values) > 1:
        if len(numbers) != len(values):
            raise KeyError(field)
        return max(numbers)
    return values[0]


def _split_path(field: str) -> list[str]:
    parts: list[str] = []
    for dotted in field.split("."):
        while "[" in dotted:
            head, _, rest = dotted.partition("[")
            if head:
                parts.append(head)
            selector, _, dotted = rest.partition("]")
            parts.append(f"[{selector}]")
        if dotted:
            parts.append(dotted)
    return parts


def figure(value: Any) -> str:
    """A figure as the table shows it: three significant digits, thousands without decimals."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float | int):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def full_runs(results: Path, name: str) -> tuple[str, list[dict[str, Any]]] | None:
    """The command and the run records of ``results/<name>.json``; None without a full run.
    A smoke run (``<name>.smoke.json``) is never read."""
    path = results / f"{name}.json"
    if not path.exists():
        return None
    series = read_series(path)
    return str(series["command"]), series["runs"]


def _values(runs: list[dict[str, Any]], field: str) -> list[float]:
    """The figure at ``field`` of every run that holds a number there."""
    values = []
    for record in runs:
        try:
            value = lookup(record, field)
        except (KeyError, TypeError):
            continue
        if isinstance(value, int | float):
            values.append(float(value))
    return values


def _spread(pooled: Pooled) -> str:
    return "" if pooled.runs == 1 else f"{figure(pooled.low)} – {figure(pooled.high)}"


def _met(pooled: Pooled, goal: str) -> str:
    if not goal:
        return "—"
    if pooled.met is None:
        return f"not judged: {pooled.runs} of {pooled.needed} runs"
    return "yes" if pooled.met else "**no**"


def measured_by(command: str, runs: list[dict[str, Any]], target: Target) -> str:
    """The command that measured a target's figure: its case's own (``cases.<name>.run``,
    where a result's cases come from several commands), else the result's."""
    parts = target.field.split(".")
    if parts[0] == "cases" and len(parts) > 1:
        for record in reversed(runs):  # the newest run that holds the case
            case = record.get("cases", {}).get(parts[1])
            run = case.get("run") if isinstance(case, dict) else None
            if isinstance(run, dict) and "command" in run:
                return str(run["command"])
    return command


def _noise_floor(results: Path, target: Target) -> str:
    if not target.noise_floor:
        return "—"
    found = full_runs(results, target.noise_floor)
    if found is None:
        measure = NOISE_FLOOR_COMMANDS.get(
            target.noise_floor, f"python benchmarks/{target.noise_floor}.py"
        )
        command = f"{measure} --runs {MIN_RUNS}"
        return f"no full run yet: {code(command)}"
    values = _values(found[1], target.field)
    if not values:
        return "not in its result"
    pooled = pool(values, "")
    runs = f"{pooled.runs} run{'s' if pooled.runs > 1 else ''}"
    spread = f" ({_spread(pooled)})" if pooled.runs > 1 else ""
    return f"{figure(pooled.value)}{spread}, {runs}"


def target_row(results: Path, target: Target) -> str:
    """One target's row: its figure pooled over the full runs, or that there is none."""
    goal = cell(target.goal) if target.goal else "—"
    noise = _noise_floor(results, target)
    found = full_runs(results, target.benchmark)
    if found is None:
        command = code(f"{target.measured_by} --runs {MIN_RUNS}")
        return (
            f"| {target.benchmark} | {cell(target.figure)} | {goal} | no full run yet | | 0 | "
            f"not judged | {noise} | {command} |"
        )
    command, runs = found
    values = _values(runs, target.field)
    by = code(measured_by(command, runs, target))
    if not values:
        return (
            f"| {target.benchmark} | {cell(target.figure)} | {goal} | not in this result | | "
            f"{len(runs)} | not judged | {noise} | {by} |"
        )
    pooled = pool(values, target.goal)
    return (
        f"| {target.benchmark} | {cell(target.figure)} | {goal} | {figure(pooled.value)} | "
        f"{_spread(pooled)} | {pooled.runs} | {_met(pooled, target.goal)} | {noise} | {by} |"
    )


def targets_table(results: Path, targets: tuple[Target, ...] = TARGETS) -> list[str]:
    """The table of every target, then a row for each full result no target reads."""
    lines = [HEADER, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [target_row(results, target) for target in targets]
    named = {t.benchmark for t in targets} | {t.noise_floor for t in targets if t.noise_floor}
    for path in sorted(results.glob("*.json")):
        name = path.name.removesuffix(".json")
        if name.endswith((".smoke", ".single")) or name in named:
            continue
        command, runs = full_runs(results, name) or ("", [])
        lines.append(
            f"| {name} | every figure: `benchmarks/results/{name}.json` | — | | | {len(runs)} | "
            f"no target in `targets.py` yet | — | {code(command)} |"
        )
    return lines


SCALING_COLUMNS = (  # (heading, field of a point)
    ("episodes/s", "episodes_per_s"),
    ("CPU ms/episode: workers", "cpu_ms_per_episode.workers"),
    ("engine actor", "cpu_ms_per_episode.engine actor"),
    ("driver", "cpu_ms_per_episode.driver"),
    ("Ray's own", "cpu_ms_per_episode.ray's own"),
    ("all engine-side", "engine_side_cpu_ms_per_episode"),
    ("engine actor's share of that CPU", "engine_actor_share"),
    ("one engine actor saturates at, episodes/s", "engine_actor_saturates_at_episodes_per_s"),
    ("nodes the workers ran on", "worker_nodes"),
)


def scaling_table(results: Path) -> list[str]:
    """The scaling benchmark's table: per worker-node count, each figure's median over the
    full runs (with its lowest and highest run where there are several)."""
    found = full_runs(results, "scaling")
    if found is None:
        return [
            "No full run of the scaling benchmark yet: measure it with "
            f"`python benchmarks/scaling.py --runs {MIN_RUNS}` on a quiet machine (a smoke "
            "run only checks that the benchmark works, and is not shown).",
        ]
    command, runs = found
    nodes = sorted({p["nodes"] for r in runs for p in r.get("points", [])})
    lines = [
        f"Measured by `{command}`: {len(runs)} run{'s' if len(runs) > 1 else ''}, each figure "
        "the median of the runs (lowest – highest run in brackets); "
        f"{runs[-1].get('episodes')} episodes at {runs[-1].get('concurrency')} in flight, "
        f"{runs[-1].get('workers_per_node')} worker actor(s) per node, "
        f"{runs[-1].get('cpus')} cores.",
        "",
        "| worker nodes | " + " | ".join(h for h, _ in SCALING_COLUMNS) + " |",
        "| --- |" + " --- |" * len(SCALING_COLUMNS),
    ]
    for count in nodes:
        cells = []
        for _, field in SCALING_COLUMNS:
            values = _values(runs, f"points[nodes={count}].{field}")
            if not values:
                cells.append("")
                continue
            middle = figure(statistics.median(values))
            spread = f" ({figure(min(values))} – {figure(max(values))})" if len(values) > 1 else ""
            cells.append(middle + spread)
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
    return lines
