"""Task sets at scale through ``rayrollout collect``; one job: four cases on shared task sets.

Memory, the first episode and mistakes, through the real command.

``task_reading.py`` measures reading and checking alone; this runs the command a user types,
in a subprocess with a local Ray of its own, against ``common.py``'s stub policy (the OpenAI
protocol on 127.0.0.1, no think time) and the weather environment inline, so what is
measured is the engine and the driver, not a model. While a command runs, ``/proc`` is
sampled every 0.2 s for the command (the driver) and every process under it (Ray's daemons,
the engine actor, the actors that play episodes, Ray Data's reader); a process's peak RSS is
the larger of its sampled RSS and the kernel's high-water mark (``VmHWM``), read at each
sample, so a peak between samples is not missed.

The task sets, made here: a NeMo Gym tasks file of N rows (a prompt and one tool schema a
row, about 480 bytes a line, no ids: each row numbered by its line), the same N rows with
ids and bad rows, and 10 N rows as 20 Parquet shards read through Ray Data. N is 10^6
(``--smoke``: 10^4). Cases:

- ``dead_policy``: the N-row file with a policy URL where nothing listens, 5 times: exit
  codes, seconds until the command ends (median and least) and its CPU seconds.
- ``first_episode``: seconds from the command to its first finished episode, for a 50-row
  file, a 1,000-row file and the N-row file, in turn, twice each, in runs that write a part
  file per row (``output.rows_per_part: 1``, as ``startup.py``'s) and are interrupted
  (SIGINT) once the first part is in the output folder. The first part file is what a user,
  or a trainer reading the folder, waits for; the progress bar is not drawn without a
  terminal. On a busy machine every run waits mostly for Ray to start, so the differences
  are reported too. The 1,000-row file is read whole before the start, as the 50-row one,
  but fills the engine (256 episodes in flight) as the N-row file does, so the N-row file's
  time less its time is what the size of the task set adds.
- ``memory``: the N-row file with ``--limit`` N/10 and N/5, and the shard set with
  ``--limit`` N/5: each process's peak RSS, seconds to the ``policy:`` line (Ray, the engine
  and its actors up, the run planned), to the first part file (1,000 rows a part, or 10 s),
  and to the exit, and episodes/s from the ``policy:`` line to the exit (Ray's shutdown
  included) and over the whole command. ``shards_over_file`` compares the shard set's
  peaks with the file's at the same limit.
- ``bad_rows``: bad rows at lines 1, N/2 and N-1 of the file with ids, and one ``task_id``
  at lines N/20 and N/20 + 0.9 N. Without ``--skip-invalid`` the command stops at line 1
  before anything starts (its message and seconds); with it, all N rows are played in two
  runs: the first interrupted (SIGINT) once 0.4 N episodes are written, the second
  ``--resume``. The rejects file must name the four lines (the repeat naming both), and the
  output must hold each of the N-4 valid tasks' ``(task_id, sample_index)`` once:
  ``duplicated`` and ``lost`` are counted with pyarrow.

The machine's load (its 1-minute average) is recorded before and after every command and
every case: RSS does not depend on it; seconds on a busy machine are upper bounds. A command
whose Ray did not start within Ray's own 30 s (a busy machine) is run again
(``ray_start_retries``).

``--cases`` runs some of the cases; the others are kept from the result file (each case
holds ``run``: the command that measured it and the load before and after it, so a file
whose cases come from several runs says which run measured which). In a series
(``--runs N``) run *i* keeps the cases of run *i* of the series it replaces, so a case
measured once stays one run, whatever N.

    python benchmarks/task_scale.py                  # N = 10^6, shards of 10^7 rows
    python benchmarks/task_scale.py --cases memory   # that case again, the others kept
    python benchmarks/task_scale.py --cases memory --runs 3   # three runs of it
    python benchmarks/task_scale.py --smoke          # N = 10^4, shards of 10^5 rows

Its four cases share the task sets, the command runner and the result file they are kept
in; sampling the command's memory is ``process_memory.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import (  # noqa: E402
    emit,
    free_port,
    keep_stdout_for_json,
    stub_policy,
)
from process_memory import MB, Watcher  # noqa: E402
from result_files import earlier_record, run_benchmark, this_command  # noqa: E402
from startup import READY_LINE, child_env, rayrollout_command  # noqa: E402
from task_reading import CITIES, TOOL  # noqa: E402

CASES = ("dead_policy", "first_episode", "memory", "bad_rows")
SHARDS = 20
ROUNDS = 5  # runs of the dead-policy case


# The task sets.


def nemo_gym_line(i: int, task_id: str | None = None) -> str:
    """Row ``i`` of a NeMo Gym weather tasks file, as one JSON line (no newline)."""
    prompt = f"What's the weather like in {CITIES[i % len(CITIES)]}?"
    row: dict[str, Any] = {} if task_id is None else {"task_id": task_id}
    row["responses_create_params"] = {
        "input": [{"role": "user", "content": prompt}],
        "tools": [TOOL],
    }
    return json.dumps(row)


BAD_LINES = {  # what a bad row of the file with ids holds, by its kind
    "malformed": '{"task_id": "bad", "responses_create_params": {"input": ',
    "no_input": json.dumps({"task_id": "bad", "responses_create_params": {"tools": [TOOL]}}),
    "tools_not_a_list": json.dumps(
        {
            "task_id": "bad",
            "responses_create_params": {
                "input": [{"role": "user", "content": "Weather?"}],
                "tools": "get_weather",
            },
        }
    ),
}


def write_file(
    path: Path, rows: int, ids: bool, bad: dict[int, str], repeat: tuple[int, int]
) -> None:
    """A tasks file of ``rows`` lines; ``bad`` maps a line to one of ``BAD_LINES``; the row at
    ``repeat[1]`` takes the id of the row at ``repeat[0]`` (with ids only)."""
    cities = [nemo_gym_line(i) for i in range(len(CITIES))]
    with path.open("w") as file:
        for line in range(1, rows + 1):
            if line in bad:
                text = BAD_LINES[bad[line]]
            elif not ids:
                text = cities[line % len(CITIES)]
            else:
                task_id = f"t{repeat[0] if line == repeat[1] else line}"
                text = '{"task_id": "' + task_id + '", ' + cities[line % len(CITIES)][1:]
            file.write(text + "\n")


def write_shards(folder: Path, shards: int, rows_per_shard: int) -> int:
    """``shards`` Parquet files of NeMo Gym rows (no ids); returns their bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    template = pa.Table.from_pylist([json.loads(nemo_gym_line(i)) for i in range(len(CITIES))])
    indices = pa.array([i % len(CITIES) for i in range(rows_per_shard)], pa.int32())
    table = template.take(indices)
    size = 0
    for shard in range(shards):
        path = folder / f"part-{shard:05d}.parquet"
        pq.write_table(table, path, row_group_size=100_000)
        size += path.stat().st_size
    return size


# Watching a command.


def _children_cpu() -> float:
    """CPU seconds of this process's ended children (a command, and what it waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load() -> float:
    return round(os.getloadavg()[0], 1)


def _sigint_default() -> None:
    """In the command's process before it starts: SIGINT back to its default. A shell
    ignores SIGINT in what it starts in the background (``python benchmarks/... &``), the
    ignoring is inherited through exec, and a Python started so never raises
    KeyboardInterrupt: the interrupted runs would play every row instead of stopping."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_command(
    argv: list[str],
    out: Path | None,
    *,
    interrupt: Callable[[Path], bool] | None = None,
    timeout_s: float = 6 * 3600,
) -> dict[str, Any]:
    """Run one command, watching its memory: its exit code, seconds to its ``policy:`` line,
    to the first part file in ``out`` and to its exit, every process's peak RSS by role, the
    console's last lines. ``interrupt(out)`` true sends it SIGINT (once), as Ctrl-C does."""
    ready: list[float] = []
    console: list[str] = []
    load_before = load()
    cpu_before = _children_cpu()
    start = time.perf_counter()
    process = subprocess.Popen(
        argv,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a Ctrl-C of this script is not the command's
        preexec_fn=_sigint_default,
    )
    watcher = Watcher(process.pid)
    watcher.start()

    def read_console() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if not ready and line.startswith(READY_LINE):
                ready.append(time.perf_counter() - start)
            console[:] = [*console[-40:], line.rstrip("\n")]

    reader = threading.Thread(target=read_console, daemon=True)
    reader.start()
    first: float | None = None
    interrupted: float | None = None
    try:
        while process.poll() is None:
            if out is not None and first is None and any(out.glob("part-*")):
                first = time.perf_counter() - start
            if interrupt is not None and interrupted is None and out is not None:
                if interrupt(out):
                    process.send_signal(signal.SIGINT)
                    interrupted = time.perf_counter() - start
            if time.perf_counter() - start > timeout_s:
                raise RuntimeError(f"{argv} ran past {timeout_s} s:\n" + "\n".join(console))
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        watcher.stop()
    total = time.perf_counter() - start
    reader.join(timeout=5)
    if out is not None and first is None and any(out.glob("part-*")):
        first = total  # written in the last 50 ms
    return {
        "exit_code": process.returncode,
        "ready_s": _round(ready[0] if ready else None),
        "first_part_s": _round(first),
        "interrupted_at_s": _round(interrupted),
        "total_s": _round(total),
        "cpu_s": _round(_children_cpu() - cpu_before),
        "load_average_1m": {"before": load_before, "after": load()},
        "rss_by_role": watcher.by_role(),
        "console_tail": console[-12:],
    }


_RAY_START_FAILED = "timed out during startup"  # Ray's own 30 s limit, met on a loaded machine
_RAY_START_TRIES = 10


def run_started(argv: list[str], out: Path | None, **options: Any) -> dict[str, Any]:
    """``run_command``, again (up to ``_RAY_START_TRIES`` times, a pause between) when Ray
    itself failed to start within its 30 s on a loaded machine, before the run began;
    ``ray_start_retries`` counts the retries."""
    for retries in range(_RAY_START_TRIES):
        result = run_command(argv, out, **options)
        failed = result["exit_code"] == 1 and result["ready_s"] is None
        if not (failed and any(_RAY_START_FAILED in line for line in result["console_tail"])):
            return {**result, "ray_start_retries": retries}
        print(f"Ray did not start (load {load()}); again", file=sys.stderr, flush=True)
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
        time.sleep(30)
    raise RuntimeError(f"Ray did not start in {_RAY_START_TRIES} tries: {result}")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# The commands.


class Collect:
    """``rayrollout collect`` of one task set against the stub, a fresh namespace each run."""

    def __init__(self, work: Path, base_url: str) -> None:
        self.work = work
        self.base_url = base_url
        self.runs = 0

    def argv(
        self, tasks: Path, out: Path, *extra: str, config: dict[str, Any] | None = None
    ) -> list[str]:
        self.runs += 1
        name = f"scale{self.runs}"
        path = self.work / f"{name}.yaml"
        settings = {"namespace": name, "ray": {"serve_port": free_port()}, **(config or {})}
        path.write_text(json.dumps(settings))  # JSON is YAML
        return [
            *rayrollout_command(),
            "collect",
            str(tasks),
            "--out",
            str(out),
            "--env",
            "weather",
            "--base-url",
            self.base_url,
            "--model",
            "stub",
            "--config",
            str(path),
            *extra,
        ]


class WrittenRows:
    """Rows in an output folder's part files, from their footers, each part read once."""

    def __init__(self) -> None:
        self.counted: dict[Path, int] = {}
        self.last = 0.0

    def __call__(self, out: Path) -> int:
        for part in out.glob("part-*.parquet"):
            if part not in self.counted:
                try:
                    self.counted[part] = pq.read_metadata(part).num_rows
                except (OSError, pa.ArrowInvalid):
                    pass  # being renamed into place: counted next time
        return sum(self.counted.values())

    def at_least(self, rows: int) -> Callable[[Path], bool]:
        """Whether ``rows`` are written, looked at every 2 s at most (a ``run_command``
        interrupt)."""

        def reached(out: Path) -> bool:
            if time.monotonic() - self.last < 2:
                return False
            self.last = time.monotonic()
            return self(out) >= rows

        return reached


def written_rows(out: Path) -> int:
    """Rows in the output folder's part files now."""
    return WrittenRows()(out)


def sample_keys(out: Path) -> pa.Table:
    """``(task_id, sample_index)`` of every row in the output folder's parts."""
    parts = sorted(out.glob("part-*.parquet"))
    return pa.concat_tables(pq.read_table(p, columns=["task_id", "sample_index"]) for p in parts)


def first_episode(collect: Collect, tasks: Path, out: Path) -> dict[str, Any]:
    """Seconds to the first part file, a part per row; interrupted once it is there."""
    argv = collect.argv(tasks, out, config={"output": {"rows_per_part": 1}})
    result = run_started(argv, out, interrupt=lambda folder: any(folder.glob("part-*")))
    shutil.rmtree(out, ignore_errors=True)
    if result["exit_code"] not in (0, 130) or result["first_part_s"] is None:
        raise RuntimeError(f"first-episode run failed: {result}")
    return result


def dead_policy(work: Path, tasks: Path) -> dict[str, Any]:
    """The N-row file with a policy URL where nothing listens, ``ROUNDS`` times (no Ray
    starts: a second each): exit codes, the median and least seconds and CPU seconds."""
    runs = []
    for _ in range(ROUNDS):
        dead = Collect(work, f"http://127.0.0.1:{free_port()}/v1")
        runs.append(run_command(dead.argv(tasks, work / "dead-out"), None))
    return {
        "exit_codes": [run["exit_code"] for run in runs],
        "seconds": statistics.median(run["total_s"] for run in runs),
        "seconds_least": min(run["total_s"] for run in runs),
        "cpu_s": statistics.median(run["cpu_s"] for run in runs),
        "driver_peak_rss_mb": max(run["rss_by_role"]["driver"]["peak_rss_mb"] for run in runs),
        "message": runs[0]["console_tail"],
        "runs": [
            {key: run[key] for key in ("exit_code", "total_s", "cpu_s", "load_average_1m")}
            for run in runs
        ],
    }


def first_episodes(collect: Collect, files: dict[str, Path], work: Path) -> dict[str, Any]:
    """``first_episode`` of each file (``rows_50``, ``rows_1000``, ``rows_n``), in turn, twice
    each: each one's median, and the N-row file's less the others'."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in files}
    for _ in range(2):
        for name, tasks in files.items():
            runs[name].append(first_episode(collect, tasks, work / f"first-{name}"))
    result: dict[str, Any] = {}
    for name, each in runs.items():
        result[name] = {
            key: statistics.median(run[key] for run in each)
            for key in ("ready_s", "first_part_s", "cpu_s")
        }
        result[name]["runs"] = each
    for name in files:
        if name != "rows_n":
            result[f"rows_n_minus_{name}_s"] = round(
                result["rows_n"]["first_part_s"] - result[name]["first_part_s"], 2
            )
    return result


def memory_case(collect: Collect, tasks: Path, out: Path, limit: int) -> dict[str, Any]:
    """A run of ``limit`` episodes: peaks by role, seconds, episodes/s."""
    result = run_started(collect.argv(tasks, out, "--limit", str(limit)), out)
    if result["exit_code"] != 0:
        raise RuntimeError(f"run of {tasks} failed: {result}")
    rows = written_rows(out)
    if rows != limit:
        raise RuntimeError(f"{limit} episodes asked, {rows} written: {result}")
    roles = result["rss_by_role"]
    shutil.rmtree(out)
    played = result["total_s"] - result["ready_s"]
    return {
        "episodes": rows,
        "driver_peak_rss_mb": roles["driver"]["peak_rss_mb"],
        "engine_peak_rss_mb": roles["EngineActor"]["peak_rss_mb"],
        "driver_peak_anon_rss_mb": roles["driver"]["peak_anon_rss_mb"],
        "engine_peak_anon_rss_mb": roles["EngineActor"]["peak_anon_rss_mb"],
        "episodes_per_s_from_ready": round(rows / played, 1),
        "episodes_per_s_whole_command": round(rows / result["total_s"], 1),
        **result,
    }


def bad_rows_case(collect: Collect, tasks: Path, out: Path, n: int, lines: dict) -> dict:
    """The file with bad rows: the error without ``--skip-invalid``, then every row played
    with it, in a run interrupted at 0.4 N episodes written and a ``--resume``."""
    stopped = run_command(collect.argv(tasks, out), out)
    message = "\n".join(stopped["console_tail"])
    without = {
        "exit_code": stopped["exit_code"],
        "seconds": stopped["total_s"],
        "names_line_1": f"{tasks.name} line 1" in message,
        "nothing_started": not out.exists() or not any(out.glob("part-*")),
        "message": stopped["console_tail"],
    }
    first = run_started(
        collect.argv(tasks, out, "--skip-invalid"),
        out,
        interrupt=WrittenRows().at_least(int(0.4 * n)),
    )
    after_first = written_rows(out)
    resumed = run_started(collect.argv(tasks, out, "--skip-invalid", "--resume"), out)
    rejects = [json.loads(text) for text in (out / "_rejects.jsonl").read_text().splitlines()]
    keys = sample_keys(out)
    counts = keys.group_by(["task_id", "sample_index"]).aggregate([([], "count_all")])
    duplicated = pc.sum(pc.subtract(counts["count_all"], 1)).as_py() or 0
    repeat_first, repeat_second = lines["repeat"]
    skipped = {*lines["bad"], repeat_second}
    expected = pa.array([f"t{line}" for line in range(1, n + 1) if line not in skipped])
    present = pc.filter(keys["task_id"], pc.equal(keys["sample_index"], 0))
    lost = len(expected) - pc.sum(pc.is_in(expected, value_set=present)).as_py()
    repeat = [r for r in rejects if r["line"] == repeat_second]
    result = {
        "without_skip_invalid": without,
        "bad_lines": dict(zip(lines["bad"], BAD_LINES, strict=True)),
        "repeat_lines": list(lines["repeat"]),
        "interrupted_run": {**first, "rows_written": after_first},
        "resumed_run": {  # its output folder held parts from the start: no first-part time
            **{key: value for key, value in resumed.items() if key != "first_part_s"},
            "episodes_played": keys.num_rows - after_first,
        },
        "rejects": [
            {"line": r["line"], "field": r["field"], "error": r["error"][:200]} for r in rejects
        ],
        "rejected_lines": sorted(r["line"] for r in rejects),
        "bad_lines_expected": sorted(skipped),
        "repeat_names_both_lines": bool(repeat) and f"line {repeat_first}" in repeat[0]["error"],
        "rows_expected": len(expected),
        "rows_written": keys.num_rows,
        "duplicated": duplicated,
        "lost": lost,
    }
    shutil.rmtree(out)
    return result


@contextmanager
def stub_started(tries: int = 3) -> Iterator[str]:
    """``common.stub_policy``'s base URL, tried again if it did not start within its 30 s
    (a loaded machine)."""
    for attempt in range(tries):
        stub = stub_policy()
        try:
            base_url, _ = stub.__enter__()
        except RuntimeError:
            if attempt == tries - 1:
                raise
            continue
        try:
            yield base_url
        finally:
            stub.__exit__(None, None, None)
        return


def log(name: str, value: dict[str, Any]) -> None:
    """A finished case's figures on stderr, as they come (a full run takes hours)."""
    print(f"{name}: {json.dumps(value)}", file=sys.stderr, flush=True)


def memory_cases(collect: Collect, work: Path, plain: Path, n: int, result: dict) -> dict:
    """The N-row file at limits N/10 and N/5, then the shard set (written here, deleted
    after) at N/5, and the shard set's peaks over the file's at the same limit."""
    memory: dict[str, Any] = {}
    for name, limit in (("file_limit_n_over_10", n // 10), ("file_limit_n_over_5", n // 5)):
        memory[name] = memory_case(collect, plain, work / "memory-out", limit)
        log(f"memory {name}", memory[name])
    shard_dir = work / "shards"
    started = time.perf_counter()
    result["shard_set_mb"] = round(write_shards(shard_dir, SHARDS, n // 2) / MB, 1)
    result["seconds_to_write_shards"] = round(time.perf_counter() - started, 1)
    try:
        shard_run = memory_case(collect, shard_dir, work / "memory-out", n // 5)
    finally:
        shutil.rmtree(shard_dir)
    memory["shards_limit_n_over_5"] = shard_run
    log("memory shards_limit_n_over_5", shard_run)
    file_run = memory["file_limit_n_over_5"]
    memory["shards_over_file"] = {
        f"{role}{part}": round(
            shard_run[f"{role}_peak{part}_rss_mb"] / file_run[f"{role}_peak{part}_rss_mb"], 3
        )
        for role in ("driver", "engine")
        for part in ("", "_anon")
    }
    return memory


def measured(value: dict[str, Any], load_before: float) -> dict[str, Any]:
    """A case's figures with ``run``: this command and the load before and after the case."""
    run = {"command": this_command(), "load_average_1m": {"before": load_before, "after": load()}}
    return {**value, "run": run}


def kept_cases(smoke: bool, run_now: list[str]) -> dict[str, Any]:
    """The cases of the result file that this run does not measure (each with its ``run``),
    from the record this run follows (``earlier_record``: run *i* of a series keeps run *i*'s)."""
    earlier = earlier_record("task_scale", smoke)
    if earlier is None or earlier.get("rows") is None:
        return {}
    return {
        name: case
        for name, case in earlier.get("cases", {}).items()
        if name not in run_now and isinstance(case, dict) and "run" in case
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="10^4 rows, shards of 10^5")
    parser.add_argument("--rows", type=int, help="rows of the file (default 10^6)")
    parser.add_argument("--work", help="folder for the task sets (default: a temp folder)")
    parser.add_argument(
        "--cases",
        nargs="*",
        default=list(CASES),
        choices=CASES,
        help="which cases to run (the others are kept from the result file)",
    )
    args = parser.parse_args()
    n = args.rows or (10_000 if args.smoke else 1_000_000)
    keep_stdout_for_json()
    lines: dict[str, Any] = {"bad": [1, n // 2, n - 1], "repeat": (n // 20, n // 20 + 9 * n // 10)}
    default_rows = args.rows is None  # a result of other sizes is not one to add cases to
    kept = kept_cases(args.smoke, args.cases) if default_rows else {}
    result: dict[str, Any] = {
        "benchmark": "task_scale",
        "smoke": args.smoke,
        "cpus": os.cpu_count(),
        "rows": n,
        "shard_set_rows": SHARDS * (n // 2),
        "first_episode": "first part file in --out (output.rows_per_part: 1); then SIGINT",
        "peak_rss": "largest of the sampled VmRSS and the kernel's VmHWM, every 0.2 s",
        "cases": {},
    }
    cases = result["cases"]
    with tempfile.TemporaryDirectory(prefix="task-scale-", dir=args.work) as tmp:
        work = Path(tmp)
        plain, small = work / "tasks.jsonl", work / "tasks-50.jsonl"
        started = time.perf_counter()
        write_file(plain, n, ids=False, bad={}, repeat=(0, 0))
        write_file(small, 50, ids=False, bad={}, repeat=(0, 0))
        result["file_mb"] = round(plain.stat().st_size / MB, 1)
        result["seconds_to_write_file"] = round(time.perf_counter() - started, 1)
        with stub_started() as base_url:
            collect = Collect(work, base_url)
            if "dead_policy" in args.cases:
                before = load()
                cases["dead_policy"] = measured(dead_policy(work, plain), before)
                log("dead_policy", cases["dead_policy"])
            if "first_episode" in args.cases:
                before = load()
                files = {"rows_50": small, "rows_1000": work / "tasks-1000.jsonl", "rows_n": plain}
                write_file(files["rows_1000"], 1000, ids=False, bad={}, repeat=(0, 0))
                cases["first_episode"] = measured(first_episodes(collect, files, work), before)
                log("first_episode", cases["first_episode"])
            if "memory" in args.cases:
                before = load()
                cases["memory"] = measured(memory_cases(collect, work, plain, n, result), before)
            if "bad_rows" in args.cases:
                before = load()
                with_ids = work / "tasks-ids.jsonl"
                bad = dict(zip(lines["bad"], BAD_LINES, strict=True))
                write_file(with_ids, n, ids=True, bad=bad, repeat=lines["repeat"])
                plain.unlink()  # one file of N rows on disk at a time
                found = bad_rows_case(collect, with_ids, work / "bad-out", n, lines)
                cases["bad_rows"] = measured(found, before)
                log("bad_rows", cases["bad_rows"])
    result["cases"] = {name: cases.get(name, kept.get(name)) for name in CASES}
    result["cases"] = {name: case for name, case in result["cases"].items() if case is not None}
    commands = {case["run"]["command"] for case in result["cases"].values()}
    result["command"] = "; ".join(sorted(commands))  # each case's own: cases.<name>.run
    emit(result)


if __name__ == "__main__":
    run_benchmark(main)
