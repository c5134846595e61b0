"""The benchmarks' targets: which figure of which result file, the bar it should clear, and
how the runs of a result are pooled to judge it.

Every benchmark keeps its latest result in ``results/<name>.json``, one record per run
(``result_files.save_result``; ``--runs N`` keeps N; a ``--smoke`` run goes to
``<name>.smoke.json``, never read here). ``docs/gen_reference.py`` reads these targets and
those files into the table of ``docs/reference/benchmarks.md``: a figure the docs show is
always one a result file holds, never one typed into prose.

``field`` is a path into one run's record: keys joined by dots, a list item picked by
``[key=value]`` (``runs[concurrency=2048].efficiency``), ``*`` for every value of a mapping
(the figure is then the largest of them). ``goal`` is ``>= X``, ``<= X`` or ``== X``; an
empty goal marks a figure reported without a target. ``command`` is for a result that a
mode of another benchmark writes (``vllm_ratio.py --noise-floor``). ``noise_floor`` names
the result whose same figure is the machine's own spread for this one (a bare side against
itself), shown beside it.

Pooling (``pool``): a measured figure is the median of its runs' figures, judged only over
at least ``MIN_RUNS`` runs; an exact count (``== X``: rows lost, duplicated) must hold in
every run, and one run can show it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MIN_RUNS", "NOISE_FLOOR_COMMANDS", "TARGETS", "Pooled", "Target", "meets", "pool"]

MIN_RUNS = 3
"""Runs a measured figure is pooled over before the table says whether it meets its target."""

NOISE_FLOOR_COMMANDS = {"vllm_ratio_noise_floor": "python benchmarks/vllm_ratio.py --noise-floor"}
"""The command that measures each noise-floor result a target names."""


def meets(value: float, goal: str) -> bool:
    """Whether ``value`` clears ``goal`` (``>= X``, ``<= X``, ``== X``)."""
    operator, _, bar = goal.partition(" ")
    checks: dict[str, Callable[[float, float], bool]] = {
        ">=": lambda a, b: a >= b,
        "<=": lambda a, b: a <= b,
        "==": lambda a, b: a == b,
    }
    if operator not in checks:
        raise ValueError(f"goal {goal!r}: write '>= X', '<= X' or '== X'")
    return checks[operator](value, float(bar))


@dataclass(frozen=True)
class Pooled:
    """A figure over the runs of one result: the pooled value, its lowest and highest run,
    how many runs hold it, how many its goal needs, and whether it meets the goal (None: no
    goal, or too few runs to judge)."""

    value: float
    low: float
    high: float
    runs: int
    needed: int
    met: bool | None


def pool(values: list[float], goal: str) -> Pooled:
    """Pool one figure's per-run values: the median, judged on the median over at least
    ``MIN_RUNS`` runs; for an exact goal (``== X``) the worst run, judged in every run."""
    if not values:
        raise ValueError("pool() needs the figure of at least one run")
    exact = goal.startswith("==")
    needed = 1 if exact or not goal else MIN_RUNS
    if exact:
        failing = [v for v in values if not meets(v, goal)]
        value = failing[0] if failing else values[0]
        met: bool | None = not failing
    else:
        value = statistics.median(values)
        met = meets(value, goal) if goal and len(values) >= needed else None
    return Pooled(value, min(values), max(values), len(values), needed, met)


@dataclass(frozen=True)
class Target:
    """One figure of one benchmark, and its bar."""

    benchmark: str
    figure: str
    field: str
    goal: str = ""
    command: str = ""  # how to measure it, where not ``python benchmarks/<benchmark>.py``
    noise_floor: str = ""  # the result whose same figure bounds this one's noise

    @property
    def measured_by(self) -> str:
        return self.command or f"python benchmarks/{self.benchmark}.py"


PAUSE_MODES = ("wait", "abort_and_retry", "continue", "interrupt")  # pause_modes.py's order

TARGETS: tuple[Target, ...] = (
    Target(
        "overhead",
        "engine / bare loop, inline environment, steady episodes/s",
        "engine_inline.ratio_steady",
        ">= 0.95",
    ),
    Target(
        "overhead",
        "engine / bare loop, inline environment, whole command",
        "engine_inline.ratio_whole",
        ">= 0.8",
    ),
    Target(
        "overhead",
        "engine / bare loop, NeMo Gym server by URL, steady episodes/s",
        "engine_url.ratio_steady",
        ">= 0.95",
    ),
    Target(
        "overhead",
        "engine / bare loop, NeMo Gym server by URL, whole command",
        "engine_url.ratio_whole",
        ">= 0.8",
    ),
    Target(
        "overhead",
        "engine / bare loop, Serve-hosted environment, steady episodes/s",
        "engine_serve.ratio_steady",
        ">= 0.5",
    ),
    Target(
        "overhead",
        "engine's CPU ms per episode (every engine process), inline",
        "engine_inline.engine_side_cpu_ms_per_episode",
        "<= 3",
    ),
    Target(
        "overhead",
        "engine actor's CPU ms per episode, NeMo Gym server by URL",
        "engine_url.cpu_ms_per_episode_by_process.engine",
        "<= 0.05",
    ),
    # The same process over the collect alone: the per-episode cost that caps one engine
    # actor's episodes/s on a core. The row above adds the actor's fixed start (its Ray
    # worker process, imports, starting the workers), spread over this run's episodes.
    Target(
        "overhead",
        "engine actor's CPU ms per episode during the collect (what caps episodes/s per core), "
        "NeMo Gym server by URL",
        "engine_url.cpu_ms_per_episode_by_process_in_collect.engine",
        "<= 0.05",
    ),
    Target(
        "overhead",
        "every engine-side process's CPU per episode / the bare loop's, inline",
        "engine_inline.cpu_ratio",
        "<= 1.5",
    ),
    Target(
        "overhead",
        "every engine-side process's CPU per episode / the bare loop's, NeMo Gym server by URL",
        "engine_url.cpu_ratio",
        "<= 1.5",
    ),
    Target(
        "latency_hiding",
        "efficiency at 2,048 episodes in flight",
        "runs[concurrency=2048].efficiency",
        ">= 0.9",
    ),
    Target(
        "latency_hiding",
        "efficiency at 8,192 episodes in flight",
        "runs[concurrency=8192].efficiency",
        ">= 0.8",
    ),
    Target("scaling", "episodes/s, 1 worker node", "points[nodes=1].episodes_per_s"),
    Target("scaling", "episodes/s, 2 worker nodes", "points[nodes=2].episodes_per_s"),
    Target("scaling", "episodes/s, 4 worker nodes", "points[nodes=4].episodes_per_s"),
    Target(
        "scaling",
        "engine actor's share of the engine side's CPU, 4 worker nodes",
        "points[nodes=4].engine_actor_share",
    ),
    Target(
        "scaling",
        "episodes/s at which one engine actor saturates a core, 4 worker nodes",
        "points[nodes=4].engine_actor_saturates_at_episodes_per_s",
    ),
    Target("memory", "RSS growth of any process, MB", "rss_mb.*.growth", "<= 100"),
    Target(
        "startup",
        "seconds to the first episode: collect, external policy, inline environment",
        "cases.collect_external_inline.first_episode_s",
        "<= 5",
    ),
    Target(
        "startup",
        "seconds to the first episode: collect, external policy, environment by URL",
        "cases.collect_external_env_url.first_episode_s",
        "<= 5",
    ),
    Target("startup", "seconds to the first episode: demo", "cases.demo.first_episode_s", "<= 10"),
    Target("startup", "seconds of `rayrollout --help`", "help.rayrollout --help.median_s", "<= 1"),
    Target(
        "agent_contract",
        "built-in agent / the loop it replaced, episodes/s",
        "ratio_contract_over_reference",
    ),
    Target("gateway", "program episodes lost", "a_programs.lost", "== 0"),
    Target("gateway", "program episodes duplicated", "a_programs.duplicated", "== 0"),
    Target(
        "gateway",
        "OpenAI SDK agent through the gateway / built-in loop, episodes/s",
        "b_in_process.rate_ratio_gateway_over_direct",
    ),
    Target("chaos", "episodes lost after kills and resumes", "folder.lost", "== 0"),
    Target("chaos", "episodes duplicated after kills and resumes", "folder.duplicated", "== 0"),
    *(
        Target(
            "kill_resume", f"rows {what}, the {who} SIGKILLed mid-run", f"{who}.rows_{what}", "== 0"
        )
        for who in ("worker", "engine", "driver")
        for what in ("lost", "duplicated")
    ),
    *(
        Target(
            "pause_modes",
            f"tokens generated and thrown away, {mode} mode"
            + (" (updates mid-generation, vLLM)" if mode == "interrupt" else ""),
            f"modes.{mode}.tokens_thrown_away",
            "== 0" if mode == "interrupt" else "",
        )
        for mode in PAUSE_MODES
    ),
    *(
        Target(
            "pause_modes", f"mean pause() wait, {mode} mode (s)", f"modes.{mode}.pause_wait_s.mean"
        )
        for mode in PAUSE_MODES
    ),
    *(
        Target("pause_modes", f"generated tokens/s, {mode} mode", f"modes.{mode}.tokens_per_s")
        for mode in PAUSE_MODES
    ),
    Target(
        "vllm_ratio",
        "engine / bare client, generated tokens/s (vLLM)",
        "ratio",
        ">= 0.95",
        noise_floor="vllm_ratio_noise_floor",
    ),
    Target(
        "vllm_ratio",
        "engine / bare client, lowest round (vLLM)",
        "ratio_min_round",
        ">= 0.9",
        noise_floor="vllm_ratio_noise_floor",
    ),
    Target(
        "vllm_ratio",
        "engine side's client CPU per generated token / the bare client's (vLLM)",
        "client_cpu_per_token_ratio",
        "<= 2",
        noise_floor="vllm_ratio_noise_floor",
    ),
    Target(
        "prefix_affinity",
        "vLLM prefix-cache hit rate on turns 2+, consistent-hash routing",
        "arms.consistent_hash.turns.later_turns.hit_rate",
        ">= 0.9",
    ),
    Target(
        "service",
        "HTTP service / actor handle, episodes/s at 256 in flight",
        "ratio.episodes_per_s",
        ">= 0.9",
    ),
    Target(
        "service",
        "seconds to a new batch's first trajectory, warm service (median)",
        "first_row_s.median",
        "<= 1",
    ),
    Target("service", "seconds to import the light client", "client_import_s.seconds"),
    Target(
        "task_reading",
        "driver bytes per row read and checked, 10^6 rows",
        "sizes.1000000.bytes_per_row",
        "<= 100",
    ),
    Target(
        "task_scale",
        "seconds to the error of a dead policy URL, 10^6-row tasks file",
        "cases.dead_policy.seconds",
        "<= 5",
    ),
    Target(
        "task_scale",
        "driver's peak RSS, MB, 10^6-row file, its first 100,000 episodes",
        "cases.memory.file_limit_n_over_10.driver_peak_rss_mb",
        "<= 400",
    ),
    Target(
        "task_scale",
        "seconds to the first episode, 10^6-row file",
        "cases.first_episode.rows_n.first_part_s",
        "<= 10",
    ),
    Target(
        "task_scale",
        "seconds to the first episode, 50-row file",
        "cases.first_episode.rows_50.first_part_s",
        "<= 10",
    ),
    Target(
        "task_scale",
        "driver's peak RSS, 10^7 rows in Parquet shards / 10^6-row file, 200,000 episodes",
        "cases.memory.shards_over_file.driver",
        "<= 1.1",
    ),
    Target(
        "task_scale",
        "engine's peak RSS, 10^7 rows in Parquet shards / 10^6-row file, 200,000 episodes",
        "cases.memory.shards_over_file.engine",
        "<= 1.1",
    ),
    Target(
        "task_scale",
        "driver's peak anonymous RSS (no libraries, no shared memory), shards / file: where "
        "a difference of the driver's peak RSS lies",
        "cases.memory.shards_over_file.driver_anon",
    ),
    Target(
        "task_scale",
        "episodes lost, 10^6 rows interrupted and resumed",
        "cases.bad_rows.lost",
        "== 0",
    ),
    Target(
        "task_scale",
        "episodes duplicated, 10^6 rows interrupted and resumed",
        "cases.bad_rows.duplicated",
        "== 0",
    ),
    Target(
        "image_storage",
        "Parquet bytes, image in every message / once per row (1,000 episodes, 6 showings)",
        "image_per_episode.size_ratio",
    ),
    Target(
        "image_storage",
        "Arrow bytes handed to the writer, image in every message / once per row",
        "image_per_episode.arrow_size_ratio",
    ),
    Target(
        "image_storage",
        "write seconds, image in every message / once per row",
        "image_per_episode.write_time_ratio",
    ),
    Target(
        "image_storage",
        "messages read back identical, images stored once per row (1: yes)",
        "image_per_episode.once_per_row.round_trip_identical",
        "== 1",
    ),
)
