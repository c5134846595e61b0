"""``RolloutEngine``, the driver-side API; one job: the driver's side of a run, start to end.

The driver-side Python API, and what the CLI runs.

It brings up Ray, Serve, the policy and the named engine actor, feeds episodes to the engine
in batches (waiting when the engine's queue is full), and reports progress while it waits.
``collect`` reads and checks its tasks through ``api.collect``, the one path the command
line takes too; ``rayrollout up`` is ``start(detached=True)``. Episodes are read from their
source in a thread (``spec_feed``: reading and checking rows never stalls the progress
reports) and only as fast as the engine's queue takes them: the driver holds two batches
ahead, never the task set. A source that fails mid-run (a bad row
past the checked head) ends the submitting; what was submitted still finishes and is
written before the error is raised, so ``--resume`` goes on from there.

Starting or attaching to the engine, feeding it, and turning its failures into one error
each belong together.
Planning a collect (``api.collect``) and the checks before start (``api.preflight``) live
apart already.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import ray
from pydantic import SecretStr
from ray.exceptions import ActorUnavailableError, RayActorError

from rayrollout.api.collect import (
    CollectPlan,
    TaskSource,
    nothing_run,
    plan_collect,
    refuse_old_parts,
)
from rayrollout.api.errors import EngineDiedError, EngineExistsError
from rayrollout.api.preflight import check_policy_kind
from rayrollout.api.spec_feed import SpecFeed
from rayrollout.auth import RouteAuth, new_token, write_token_file
from rayrollout.data.config import ConfigError, RunConfig
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Trajectory
from rayrollout.engine.engine_actor import ENGINE_NAME, EngineActor, start_workers
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.engine.feeding import worker_name
from rayrollout.engine.placement import cpu_actor_options
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.secret_env import route_token_path, workers_policy_key
from rayrollout.engine.startup import ensure_ray, named_actor, prepare_policy
from rayrollout.errors import RayrolloutError
from rayrollout.policy.kinds import CheckedPolicy

__all__ = [
    "CollectResult",
    "EngineDiedError",
    "EngineExistsError",
    "RolloutEngine",
    "read_trajectories",
]

_SUBMIT_BATCH = 256
ProgressCallback = Callable[[RunSnapshot], None]
PlanCallback = Callable[[CollectPlan], None]

T = TypeVar("T")


class CollectResult:
    """Where a collection went and its figures; rows are read back on demand."""

    def __init__(self, out_dir: Path, fmt: str, summary: RunSnapshot) -> None:
        self.out_dir = out_dir
        self.format = fmt
        self.summary = summary
        self.parts = [Path(p) for p in summary.parts]

    def trajectories(self) -> list[Trajectory]:
        """This collection's trajectories (not other collections' in the same folder)."""
        return list(RunFolder(self.out_dir, self.format).trajectories(self.parts))

    def groups(self) -> dict[str, list[Trajectory]]:
        """Trajectories grouped by task (GRPO groups), samples in index order."""
        grouped: dict[str, list[Trajectory]] = defaultdict(list)
        for trajectory in self.trajectories():
            grouped[trajectory.task_id].append(trajectory)
        for samples in grouped.values():
            samples.sort(key=lambda t: t.sample_index)
        return dict(grouped)

    def dataset(self) -> ray.data.Dataset:
        """This collection's parts as a Ray Dataset (read lazily, block by block)."""
        parts = [str(p) for p in self.parts]
        if self.format == "parquet":
            return ray.data.read_parquet(parts)
        return ray.data.read_json(parts)


def read_trajectories(
    source: str | Path | list[Path], fmt: str | None = None
) -> Iterator[Trajectory]:
    """Stream trajectories back from an output folder (or a list of its parts), part by part.

    A folder is read whole: its Parquet and JSONL parts alike (a run resumed with another
    format leaves both), unless ``fmt`` names one format. Parts written by an older version
    read under the current schema, a field they lack taking its default.

    Example:
        >>> from rayrollout import read_trajectories
        >>> rewards = [t.reward for t in read_trajectories("rollouts/run1")]  # doctest: +SKIP
    """
    if isinstance(source, list):
        return RunFolder(Path(source[0]).parent if source else ".").trajectories(source)
    folder = RunFolder(source)
    return folder.trajectories(folder.parts(fmt))


class RolloutEngine:
    """Runs tasks as scored multi-turn episodes on Ray.

    Example:
        >>> from rayrollout import RolloutEngine
        >>> with RolloutEngine({"output": {"dir": "out"}}) as engine:  # doctest: +SKIP
        ...     result = engine.collect([{"prompt": "What's the weather like in Oslo?",
        ...                               "environment": "weather"}], num_repeats=2)
        ...     print(result.summary.total.episodes)
        2
    """

    def __init__(
        self,
        config: RunConfig | dict[str, Any] | None = None,
        *,
        policy: CheckedPolicy | None = None,
    ) -> None:
        """``policy``: the kind as a plan already checked it for this config (a
        ``CollectPlan``'s ``policy``); None: the kind and its own settings are checked here,
        before anything starts."""
        if not isinstance(config, RunConfig):
            config = RunConfig.model_validate(config or {})
        self.policy = policy if policy is not None else check_policy_kind(config)
        # Absolute before Ray starts: a driver under `ray job submit` may change directory,
        # and the engine actor writes from its own working directory.
        out_dir = str(Path(config.output.dir).absolute())
        self.config = config.model_copy(
            update={"output": config.output.model_copy(update={"dir": out_dir})}
        )
        self.engine: Any = None
        self.run_id: str | None = None  # the engine's run (names its parts), once started
        self.collections = 0  # collect() calls on this engine so far
        self.attached = False  # True: the engine is `rayrollout up`'s, shutdown leaves it up
        self.policy_url = ""
        self.stop_policy: Callable[[], None] | None = None  # a policy this driver started
        # What the run's HTTP routes (a deployed policy, Serve-hosted environments, vLLM's
        # control routes) take as 'Authorization: Bearer ...' (rayrollout.auth); written,
        # owner-only, to route_token_path(namespace) when the engine starts.
        self.route_token = SecretStr(new_token())

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self, run_id: str | None = None, *, detached: bool = False) -> RolloutEngine:
        """Bring up Ray, the policy and the engine actor with its workers.

        An engine ``rayrollout up`` left in the namespace is attached to instead (its config
        decides where output goes), and left up by ``shutdown``.

        Args:
            run_id: Names this run's part files (default: the time and a random suffix).
            detached: Start an engine that outlives this driver, with the config's
                environments deployed now (``rayrollout up``); later drivers attach to it.

        Raises:
            EngineExistsError: another run's engine holds the namespace (any engine, when
                ``detached``); nothing was deployed.
            WriterError: the output folder cannot be created, or another run holds its lock.
        """
        return self._start(run_id, detached=detached)

    def _start(
        self, run_id: str | None = None, *, detached: bool = False, new_run: bool = False
    ) -> RolloutEngine:
        """``start``; ``new_run`` (a ``collect``): refuse an output folder holding another
        run's parts before the policy is deployed (``refuse_old_parts``)."""
        bound = self.policy.kind.driver_bound
        reason = bound(self.config) if detached and bound is not None else None
        if reason is not None:
            raise ConfigError(reason)
        ensure_ray(self.config)
        namespace = self.config.namespace
        existing = named_actor(ENGINE_NAME, namespace)
        if existing is not None:
            if not detached and ray.get(existing.info.remote(), timeout=60)["detached"]:
                return self._attach(existing)  # started by `rayrollout up`: use it, leave it up
            raise EngineExistsError(
                f"an engine is already running in Ray namespace '{namespace}': stop it "
                f"(`rayrollout down --namespace {namespace}`, or end that run), or use "
                "another --namespace"
            )
        if new_run:  # cheap, before the policy deploys; checked again under the lock
            output, resume = self.config.output, self.config.resume
            refuse_old_parts(RunFolder(output.dir), None, resume=resume, overwrite=output.overwrite)
        token = self.route_token.get_secret_value()
        try:  # for a person calling the routes by hand; the run itself never reads it
            write_token_file(route_token_path(namespace), token)
        except OSError:  # a read-only home (some job drivers): the run needs no file
            pass
        self.policy_url, deploy = prepare_policy(self.config, RouteAuth.bearer(token), self.policy)
        # Serve brings the policy up while the engine starts its workers (Ray actors):
        # neither needs the other before the first episode, and each takes seconds.
        deploying = _in_background(deploy) if deploy is not None else None
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        policy_key = workers_policy_key(self.config, self.route_token, self.policy.deploys)
        # A run that ends with this driver starts its workers here, beside the engine actor
        # (seconds sooner than from the engine's constructor); a detached engine owns its own.
        workers = None if detached else start_workers(self.config, self.policy_url, policy_key)
        self.engine = EngineActor.options(  # type: ignore[attr-defined]
            name=ENGINE_NAME,
            namespace=namespace,
            lifetime="detached" if detached else None,
            **cpu_actor_options(self.config, {}),
        ).remote(
            self.config,
            self.policy_url,
            run_id,
            detached,
            policy_key,
            driver_pid=os.getpid(),
            route_token=self.route_token,
            workers=workers,
        )
        self.run_id = run_id
        self.attached = detached  # shutdown leaves a detached engine up, as an attached one
        try:
            started = self.engine.start.remote()
            if deploying is not None:  # first: environments deploy only onto a started Serve
                self.stop_policy = deploying.result()
            ray.get(started)
            if detached:
                ray.get(self.engine.ensure_environments.remote(sorted(self.config.environments)))
        except ray.exceptions.RayTaskError as exc:
            self._discard()  # a half-started engine would hold the namespace's name
            if isinstance(exc.cause, RayrolloutError):
                raise exc.cause from None  # the engine's own error, without Ray's wrapping
            raise
        except Exception:  # the policy's deployment failed: no engine without its policy
            self._discard()
            raise
        return self

    def _attach(self, engine: Any) -> RolloutEngine:
        """Use the engine ``rayrollout up`` started; its config decides where output goes."""
        info = ray.get(engine.info.remote(), timeout=60)
        self.engine, self.attached = engine, True
        self.policy_url, self.run_id = info["policy_url"], info.get("run_id")
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
    ) -> RunSnapshot:
        """Run episodes to the end, writing them out; returns the run's figures.

        ``specs`` is read a batch at a time as the engine's queue takes them. If reading it
        raises, the episodes submitted before finish and are written, then the error is
        raised.
        """
        if self.engine is None:
            self.start()
        try:
            return asyncio.run(self._run(specs, on_progress, progress_interval_s))
        except RayActorError as exc:
            if not isinstance(exc, ActorUnavailableError) and self._engine_alive():
                raise
            raise EngineDiedError(
                f"the engine actor died mid-run ({_first_line(exc)}); finished episodes are "
                f"in {self.config.output.dir}: run the same command again with --resume "
                "(resume=True in Python) to finish the run"
            ) from None

    async def _run(
        self,
        specs: Iterable[EpisodeSpec],
        on_progress: ProgressCallback | None,
        interval: float,
    ) -> RunSnapshot:
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
        feed = SpecFeed(specs, ahead=2 * _SUBMIT_BATCH)  # reads in its thread, never further
        stopped: Exception | None = None
        try:
            ended = False
            while not ended:
                # What is ready, at least one spec; a source that fails hands over what it
                # read before the error, which is submitted and run out.
                batch, ended, stopped = await asyncio.to_thread(feed.take, _SUBMIT_BATCH)
                if batch:
                    await self.engine.submit.remote(batch)
            summary = await self.engine.finish.remote()
        finally:
            feed.stop()
            done.set()
            await reporter
        if on_progress is not None:
            on_progress(summary)
        if stopped is not None:
            raise stopped
        return summary

    def flush(self) -> None:
        """Write out every finished row the engine still buffers (used on interrupt)."""
        if self.engine is not None:
            ray.get(self.engine.flush.remote(), timeout=30)

    def collect(
        self,
        tasks: TaskSource | None = None,
        num_repeats: int | None = None,
        on_progress: ProgressCallback | None = None,
        on_plan: PlanCallback | None = None,
    ) -> CollectResult:
        """Run every task ``num_repeats`` times; the trajectories land in the output folder.

        What ``rayrollout collect`` runs: the checks that need no rows first, then a tasks
        file's first rows (all of a small file, or of a list), then the rest streamed to the
        engine as it takes them, each row checked on the way, in memory flat however many
        rows there are (``api.collect``); the config's ``skip_invalid`` (bad rows to the
        output folder's rejects file), ``limit`` and ``resume`` apply.

        Args:
            tasks: A tasks file (JSONL or Parquet), a shard set (a directory or glob of
                them, read through Ray Data), a list of rows (``Task`` objects or dicts), or
                an iterator of rows (streamed: each checked as it is submitted); None: the
                config's ``tasks``.
            num_repeats: Samples per task (default: the config's).
            on_progress: Called with the engine's figures every 0.5 s and at the end.
            on_plan: Called once the engine holds the output folder, before the first
                episode, with what will run (``CollectPlan``: episodes, rejects, written).

        Raises:
            InvalidTasksError: bad rows (without ``skip_invalid``): among the first rows,
                and nothing was started; or past them (``stopped``), and the run stopped at
                the first, the episodes before it written.
            OutputNotEmptyError: the output folder holds an earlier run's parts, and neither
                ``resume`` nor ``output.overwrite`` is set; nothing was run.
            EngineDiedError: the engine actor died mid-run; ``resume`` finishes it.
            ConfigError: no tasks given, or the tasks file does not exist.
            EngineExistsError, WriterError: as ``start``.
        """
        if isinstance(tasks, CollectPlan):  # planned, and checked, by the caller
            plan = tasks
            plan.num_repeats = num_repeats or plan.num_repeats
        else:
            plan = plan_collect(
                tasks,
                self.config,
                num_repeats,
                before_start=self.engine is None,
                policy=self.policy,
            )
        if plan.empty and self.engine is None:  # a file without rows: start nothing
            return CollectResult(
                Path(self.config.output.dir), self.config.output.format, nothing_run()
            )
        if self.engine is None:
            self._start(new_run=True)  # takes the output folder's lock before reading it
        plan.open_output(self.config, self.run_id, first=self.collections == 0)
        self.collections += 1
        if on_plan is not None:
            on_plan(plan)
        summary = self.run(plan.specs(), on_progress)
        return CollectResult(Path(self.config.output.dir), self.config.output.format, summary)

    def shutdown(self) -> None:
        """Stop the engine and its workers (Ray and Serve stay up for whoever started them).

        An engine attached to (started by ``rayrollout up``) stays up; its output is
        flushed.
        """
        if self.engine is not None and self.attached:
            ray.get(self.engine.flush.remote(), timeout=60)
            self.engine = None
            return
        self._discard()

    def _engine_alive(self) -> bool:
        """Whether the engine actor still answers (a dead one fails every call)."""
        try:
            ray.get(self.engine.info.remote(), timeout=10)
        except (RayActorError, ray.exceptions.GetTimeoutError):
            return False
        return True

    def _discard(self) -> None:
        """Close and kill this driver's engine and its workers."""
        if self.engine is not None:
            try:
                ray.get(self.engine.close.remote(), timeout=30)
            except Exception:  # a dead engine's lock is released by the OS anyway
                pass
            for i in range(self.config.workers.num_workers):
                try:
                    ray.kill(ray.get_actor(worker_name(i), namespace=self.config.namespace))
                except ValueError:
                    pass
            ray.kill(self.engine)
            self.engine = None
        if self.stop_policy is not None:
            self.stop_policy()
            self.stop_policy = None


def _first_line(error: BaseException) -> str:
    """The first line of an error's message, cut to 200 characters (Ray's run to pages)."""
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return line if len(line) <= 200 else line[:197] + "..."


def _in_background(call: Callable[[], T]) -> Future[T]:
    """Run ``call`` in a daemon thread; its outcome (or error) in the returned future.

    A daemon thread rather than an executor's: Ctrl-C while it runs ends the driver at once,
    as it did when the policy deployed on the main thread.
    """
    future: Future[T] = Future()

    def run() -> None:
        try:
            result = call()
        except BaseException as exc:  # handed to the waiting thread, raised there
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=run, name="policy-deploy", daemon=True).start()
    return future
