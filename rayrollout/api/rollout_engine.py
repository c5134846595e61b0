"""``RolloutEngine``: the driver-side Python API (and what the CLI runs).

It brings up Ray, Serve, the policy and the named engine actor, feeds episodes to the engine
in batches (waiting when the engine's queue is full), and reports progress while it waits.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import ray

from rayrollout.data.config import RunConfig
from rayrollout.data.schema import Task, Trajectory, trajectory_arrow_schema
from rayrollout.data.writer import written_keys
from rayrollout.engine.actor import ENGINE_NAME, EngineActor
from rayrollout.engine.episode import EpisodeSpec
from rayrollout.engine.placement import cpu_actor_options
from rayrollout.engine.services import deploy_policy, ensure_ray

__all__ = ["CollectResult", "RolloutEngine", "read_trajectories"]

_SUBMIT_BATCH = 256
ProgressCallback = Callable[[dict[str, Any]], None]


class EngineExistsError(RuntimeError):
    """Another run's engine holds the name in this namespace."""


class CollectResult:
    """Where a collection went and its figures; rows are read back on demand."""

    def __init__(self, out_dir: Path, fmt: str, summary: dict[str, Any]) -> None:
        self.out_dir = out_dir
        self.format = fmt
        self.summary = summary
        self.parts = [Path(p) for p in summary.get("parts", [])]

    def trajectories(self) -> list[Trajectory]:
        """This collection's trajectories (not other collections' in the same folder)."""
        return list(read_trajectories(self.parts, self.format))

    def groups(self) -> dict[str, list[Trajectory]]:
        """Trajectories grouped by task (GRPO groups), samples in index order."""
        grouped: dict[str, list[Trajectory]] = defaultdict(list)
        for trajectory in self.trajectories():
            grouped[trajectory.task_id].append(trajectory)
        for samples in grouped.values():
            samples.sort(key=lambda t: t.sample_index)
        return dict(grouped)

    def dataset(self) -> ray.data.Dataset:
        """The output folder as a Ray Dataset (read lazily, block by block)."""
        parts = [str(p) for p in self.parts]
        if self.format == "parquet":
            return ray.data.read_parquet(parts)
        return ray.data.read_json(parts)


def read_trajectories(
    source: str | Path | list[Path], fmt: str = "parquet"
) -> Iterator[Trajectory]:
    """Stream trajectories back from an output folder (or a list of its parts), part by part."""
    import json

    import pyarrow.dataset as ds

    if isinstance(source, list):
        paths = source
    else:
        paths = sorted(Path(source).glob(f"part-*.{'parquet' if fmt == 'parquet' else 'jsonl'}"))
    if fmt == "parquet":
        if not paths:
            return
        # The current schema, not the first part's: parts written before a field was added
        # (a turn's policy_version) read with nulls instead of hiding it in newer parts.
        schema = trajectory_arrow_schema()
        for batch in ds.dataset(
            [str(p) for p in paths], format="parquet", schema=schema
        ).to_batches():
            for row in batch.to_pylist():
                yield Trajectory.from_row(row)
        return
    for path in paths:
        with path.open(encoding="utf-8") as file:
            for line in file:
                if line.strip():
                    yield Trajectory.from_row(json.loads(line))


class RolloutEngine:
    """Runs tasks as scored multi-turn episodes on Ray.

    Example:
        >>> from rayrollout import RolloutEngine
        >>> with RolloutEngine({"output": {"dir": "out"}}) as engine:  # doctest: +SKIP
        ...     result = engine.collect([{"prompt": "What's the weather like in Oslo?",
        ...                               "environment": "weather"}], num_repeats=2)
        ...     print(result.summary["total"]["episodes"])
        2
    """

    def __init__(self, config: RunConfig | dict[str, Any] | None = None) -> None:
        if not isinstance(config, RunConfig):
            config = RunConfig.model_validate(config or {})
        self.config = config
        self.engine: Any = None
        self.attached = False  # True: the engine is `rayrollout up`'s, shutdown leaves it up
        self.policy_url = ""

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self, run_id: str | None = None) -> RolloutEngine:
        """Bring up Ray, the policy and the engine actor with its agents."""
        ensure_ray(self.config)
        try:
            existing = ray.get_actor(ENGINE_NAME, namespace=self.config.namespace)
        except ValueError:
            existing = None
        if existing is not None and ray.get(existing.info.remote(), timeout=60)["detached"]:
            return self._attach(existing)  # started by `rayrollout up`: use it, leave it up
        self.policy_url = deploy_policy(self.config)
        if existing is not None:
            raise EngineExistsError(
                f"an engine is already running in namespace '{self.config.namespace}': "
                "use another --namespace, or stop that run first"
            )
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.engine = EngineActor.options(
            name=ENGINE_NAME,
            namespace=self.config.namespace,
            **cpu_actor_options(self.config, {}),
        ).remote(self.config, self.policy_url, run_id)
        ray.get(self.engine.start.remote())
        return self

    def _attach(self, engine: Any) -> RolloutEngine:
        """Use the engine ``rayrollout up`` started; its config decides where output goes."""
        info = ray.get(engine.info.remote(), timeout=60)
        self.engine, self.attached = engine, True
        self.policy_url = info["policy_url"]
        self.config = self.config.model_copy(
            update={
                "output": self.config.output.model_copy(
                    update={"dir": info["output_dir"], "format": info["output_format"]}
                )
            }
        )
        ray.get(engine.ensure_environments.remote(sorted(self.config.environments)))
        return self

    def run(
        self,
        specs: Iterable[EpisodeSpec],
        on_progress: ProgressCallback | None = None,
        progress_interval_s: float = 0.5,
    ) -> dict[str, Any]:
        """Run episodes to the end, writing them out; returns the run's figures."""
        if self.engine is None:
            self.start()
        return asyncio.run(self._run(specs, on_progress, progress_interval_s))

    async def _run(
        self,
        specs: Iterable[EpisodeSpec],
        on_progress: ProgressCallback | None,
        interval: float,
    ) -> dict[str, Any]:
        done = asyncio.Event()

        async def report() -> None:
            while not done.is_set():
                if on_progress is not None:
                    on_progress(await self.engine.progress.remote())
                try:
                    await asyncio.wait_for(done.wait(), interval)
                except TimeoutError:
                    pass

        await self.engine.begin.remote()
        reporter = asyncio.create_task(report())
        try:
            batch: list[EpisodeSpec] = []
            for spec in specs:
                batch.append(spec)
                if len(batch) >= _SUBMIT_BATCH:
                    await self.engine.submit.remote(batch)
                    batch = []
            if batch:
                await self.engine.submit.remote(batch)
            summary = await self.engine.finish.remote()
        finally:
            done.set()
            await reporter
        if on_progress is not None:
            on_progress(summary)
        return summary

    def flush(self) -> None:
        """Write out every finished row the engine still buffers (used on interrupt)."""
        if self.engine is not None:
            ray.get(self.engine.flush.remote(), timeout=30)

    def collect(
        self,
        tasks: Iterable[Task | dict[str, Any]],
        num_repeats: int | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> CollectResult:
        """Run every task ``num_repeats`` times; the trajectories land in the output folder."""
        repeats = num_repeats or self.config.num_repeats
        if self.engine is None:
            self.start()  # takes the output folder's lock before reading what is in it
        done = (
            written_keys(self.config.output.dir, self.config.output.format)
            if self.config.resume
            else set()
        )
        summary = self.run(expand(tasks, repeats, done, self.config.environment), on_progress)
        return CollectResult(Path(self.config.output.dir), self.config.output.format, summary)

    def shutdown(self) -> None:
        """Stop the engine and its agents (Ray and Serve stay up for whoever started them).

        An engine attached to (started by ``rayrollout up``) stays up; its output is
        flushed.
        """
        if self.engine is not None and self.attached:
            ray.get(self.engine.flush.remote(), timeout=60)
            self.engine = None
            return
        if self.engine is not None:
            try:
                ray.get(self.engine.close.remote(), timeout=30)
            except Exception:  # a dead engine's lock is released by the OS anyway
                pass
            for i in range(self.config.agents.num_agents):
                try:
                    ray.kill(ray.get_actor(f"agent:{i}", namespace=self.config.namespace))
                except ValueError:
                    pass
            ray.kill(self.engine)
            self.engine = None


def expand(
    tasks: Iterable[Task | dict[str, Any]],
    num_repeats: int,
    skip: set[tuple[str, int]],
    default_environment: str | None = None,
) -> Iterator[EpisodeSpec]:
    """One spec per (task, sample index), leaving out those in ``skip`` (already written)."""
    from rayrollout.data.tasks import parse_task_row

    for i, task in enumerate(tasks, start=1):
        if not isinstance(task, Task):
            task = parse_task_row(task, default_environment=default_environment, line=i)
        for sample in range(num_repeats):
            if (task.task_id, sample) not in skip:
                yield EpisodeSpec(task, sample)
