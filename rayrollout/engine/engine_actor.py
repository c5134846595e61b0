"""The engine actor; one job: the control of the collect pipeline, from queue to committed rows.

Named ``engine`` in the run's namespace, so drivers and training loops find it with
``ray.get_actor("engine", namespace=NS)``. Work arrives through ``submit`` (which waits while
the queue is full: backpressure, not timeouts); a feeder takes chunks off the queue while
each worker holds fewer than its share of ``concurrency`` plus its part of the ``reserve``,
and sends each to the worker with the most room in one Ray call. The worker writes the rows
of a ``collect`` to its own parts (``worker_parts``) and streams back, as its episodes
finish (a Ray streaming generator), which finished and later which a renamed part holds:
rows never pass through this actor, which keeps the queue, the counts and the slots. Rows a
caller waits on (``generate``, the service's stream) come back as Arrow and are written
here when asked. If the worker dies, the episodes whose rows are in no part yet are sent
again (a restarted worker answers those a part of its killed process holds from that part),
so no row is written twice. Nothing is kept per task beyond the episodes in flight (their
specs, and a ``generate`` call's waiter) and ``next_sample``'s digests, so a run's memory
does not grow with its task set.

The actor's other two jobs have their own modules: the training-loop methods (``generate``,
``pause``, ``resume``, ``update_weights``, ``stats``) in ``training``, and putting
environments up on Serve in ``deploy``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

import pyarrow as pa
import ray
from pydantic import SecretStr
from ray.exceptions import ActorUnavailableError, RayActorError

from rayrollout.auth import RouteAuth, new_token
from rayrollout.data.config import RunConfig
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.task_digests import NextSamples
from rayrollout.data.writer import PartWriter, make_sink
from rayrollout.engine.chunks import ChunkRows
from rayrollout.engine.deploy import EnvironmentDeployer
from rayrollout.engine.episode_frame import EpisodeSpec, failed_trajectory
from rayrollout.engine.feeding import Refill, chunk_size, worker_limits, worker_with_room
from rayrollout.engine.groups import SamplingCounts
from rayrollout.engine.metrics import RunMetrics
from rayrollout.engine.placement import worker_actor_options
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import RunStats
from rayrollout.engine.streaming import StreamingAPI
from rayrollout.engine.training import TrainingLoopAPI
from rayrollout.engine.weights import WeightSync
from rayrollout.engine.worker import WorkerActor, worker_name, worker_share
from rayrollout.engine.worker_parts import PartsTarget
from rayrollout.gc_tuning import tune_gc

__all__ = ["ENGINE_NAME", "EngineActor", "start_workers"]

ENGINE_NAME = "engine"
_RESEND_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)  # then every 4 s until workers.restart_deadline_s
logger = logging.getLogger(__name__)


def start_workers(config: RunConfig, policy_url: str, policy_key: SecretStr | None) -> list[Any]:
    """Start the run's worker actors (``worker:<i>``); their handles, at once.

    The driver of a run that ends with it starts them beside the engine actor, not from it:
    each is a Python process of a second or more of imports, and the engine's own start need
    not come first. The caller owns them, so a detached engine starts its own."""
    return [
        WorkerActor.options(  # type: ignore[attr-defined]  # a Ray actor class (stubs)
            name=worker_name(i),
            namespace=config.namespace,
            max_concurrency=100_000,
            **worker_actor_options(config, {"num_cpus": config.workers.num_cpus}),
        ).remote(
            worker_name(i),
            config,
            policy_url,
            policy_key,
            worker_share(config.concurrency, config.workers.num_workers, i),
        )
        for i in range(config.workers.num_workers)
    ]


# Ray's type stubs give ray.remote(...) task options only; max_concurrency is an actor's.
@ray.remote(num_cpus=0, max_concurrency=10_000)  # type: ignore[call-overload]
class EngineActor(TrainingLoopAPI, StreamingAPI):
    """Runs episodes on the worker pool and streams their rows to the output folder."""

    def __init__(
        self,
        config: RunConfig,
        policy_url: str,
        run_id: str,
        detached: bool = False,
        policy_key: SecretStr | None = None,  # the workers' and weights' (secret_env.py)
        driver_pid: int | None = None,  # the run's driver, noted in the folder's lock
        route_token: SecretStr | None = None,  # what the run's HTTP routes take (auth.py)
        workers: list[Any] | None = None,  # started by the driver beside this actor
    ) -> None:
        self.config = config
        self.policy_url = policy_url
        self.detached = detached  # started by `rayrollout up`: drivers attach, never kill it
        if workers is None:  # a detached engine owns its workers: they outlive the driver
            workers = start_workers(config, policy_url, policy_key)
        self.workers = workers
        out = config.output
        self.run_id = run_id
        self.folder = RunFolder(out.dir, out.format)
        # Noted in the folder's lock: a second run refuses at once while this run's driver
        # lives, and waits out this actor if the driver was killed (see folder_lock).
        self.folder.driver_pid = None if detached else driver_pid
        self.sink = make_sink(self.folder, out.format, run_id)
        self.writer = PartWriter(self.sink, out.rows_per_part, out.flush_interval_s)
        self.run_stats = RunStats()
        self.metrics = RunMetrics(config.namespace)
        self.chunk = chunk_size(config.concurrency, config.workers.num_workers)
        self.queue: asyncio.Queue[EpisodeSpec] = asyncio.Queue(maxsize=2 * config.concurrency)
        # Without a token given, a fresh one nobody holds: the routes answer no one over HTTP.
        token = route_token.get_secret_value() if route_token else new_token()
        self.environments = EnvironmentDeployer(config, RouteAuth.bearer(token))
        self.write_lock = asyncio.Lock()
        self.feeder: asyncio.Task[None] | None = None
        self.calls: set[asyncio.Task[None]] = set()  # worker calls in flight
        self.load = [0] * len(self.workers)  # episodes in flight per worker
        self.room = asyncio.Event()  # set when an episode ends: the feeder may send more
        self.refill = Refill(config.concurrency, len(self.workers))  # sizes the reserve
        self.flusher: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        self.submitted = 0
        self.completed = 0
        self.all_done = asyncio.Event()
        self.all_done.set()
        # Rows of finished episodes that a worker holds and no part yet: finish() waits
        # for them after all_done.
        self.uncommitted = 0
        self.all_committed = asyncio.Event()
        self.all_committed.set()
        self.worker_rows = 0  # rows the workers' renamed parts hold
        self.worker_seconds = 0.0  # the workers' time writing them
        self.part_paths: dict[str, None] = {}  # every part of this run, in commit order
        self.batch_first_part = 0
        self.target = PartsTarget(
            str(self.folder.path),
            out.format,
            run_id,
            os.getpid(),  # the folder lock's holder: workers write under it (fenced)
            out.rows_per_part,
            out.flush_interval_s,
            ray.get_runtime_context().get_node_id(),
        )
        # The key the policy's routes take (the run's token for a policy it deployed).
        key = policy_key.get_secret_value() if policy_key is not None else None
        self.weights = WeightSync(config, policy_url, self.workers, key)
        self.sampling = SamplingCounts()
        self.waiters: dict[int, _Waiter] = {}  # id(spec) -> the generate() call awaiting it
        # The next free sample index per task id, as digests: read from the folder when first
        # needed (generate(write=True)); the only state the engine keeps per task.
        self.next_sample: NextSamples | None = None
        tune_gc()  # it takes every row of the run; see gc_tuning

    async def start(self) -> list[str]:
        """Wait for the workers and open the output; returns the workers' names."""
        names = await asyncio.gather(*(worker.ready.remote() for worker in self.workers))
        await asyncio.to_thread(self.sink.start)
        self.feeder = asyncio.create_task(self._feed())
        self.flusher = asyncio.create_task(self._flush_periodically())
        return list(names)

    def info(self) -> dict[str, Any]:
        """Who this engine is: drivers attach to a detached one (started by ``up``)."""
        return {
            "detached": self.detached,
            "policy_url": self.policy_url,
            "output_dir": self.config.output.dir,
            "output_format": self.config.output.format,
            "num_workers": len(self.workers),
            "run_id": self.run_id,
        }

    async def ensure_environments(self, names: list[str]) -> None:
        """Deploy these environments now (``rayrollout up``) rather than at their first task."""
        await self.environments.ensure_all(names)

    def begin(self) -> None:
        """Start a new batch of work (a ``collect``): fresh figures, parts counted from here."""
        self.run_stats = RunStats()
        self.batch_first_part = len(self.part_paths)

    async def submit(self, specs: list[EpisodeSpec]) -> None:
        """Queue episodes; waits while the queue is full.

        Episodes of an environment still to be put up on Serve wait for its deployment
        (seconds: a replica process starts); the batch's other episodes are queued while it
        deploys, so a run's inline environments play from the first second.
        """
        if self.failure is not None:
            raise self.failure
        to_deploy = self.environments.to_deploy(s.task.environment for s in specs)
        if to_deploy:
            deploying = asyncio.ensure_future(self.environments.ensure_all(sorted(to_deploy)))
            await self._queue([s for s in specs if s.task.environment not in to_deploy])
            await deploying  # a failed deployment is the caller's error
            specs = [s for s in specs if s.task.environment in to_deploy]
        await self._queue(specs)

    async def _queue(self, specs: list[EpisodeSpec]) -> None:
        """Count episodes as submitted and put them on the queue (waits while it is full)."""
        if not specs:
            return
        self.submitted += len(specs)
        self.metrics.on_submit([s.task.environment for s in specs])
        self.all_done.clear()
        for spec in specs:
            spec.queued_at = time.time()
            await self.queue.put(spec)

    async def finish(self) -> RunSnapshot:
        """Wait for every episode submitted so far, write what is buffered, return the figures.

        The engine stays up for the next batch; ``close`` releases the output folder.
        """
        await self.all_done.wait()
        await self._commit_workers()
        await self._write([], drain=True)
        if self.failure is not None:
            raise self.failure
        snapshot = self.progress()
        snapshot.parts = list(self.part_paths)[self.batch_first_part :]
        return snapshot

    async def _commit_workers(self) -> None:
        """Have the workers write what they buffer, until a part holds every finished row
        (a worker that died meanwhile plays its episodes again: they are flushed too)."""
        while not self.all_committed.is_set():
            await asyncio.gather(
                *(worker.flush.remote() for worker in self.workers), return_exceptions=True
            )
            try:
                await asyncio.wait_for(self.all_committed.wait(), 0.5)
            except TimeoutError:
                pass

    async def close(self) -> None:
        """Stop the feeder and the worker calls; complete the output (releases the lock)."""
        for task in [self.feeder, *self.calls, self.flusher]:
            if task is not None:
                task.cancel()
        if self.failure is not None:
            self.sink.failed(self.failure)
        else:
            self.sink.complete()

    async def flush(self) -> int:
        """Write every buffered row now (an interrupted driver calls this); returns rows written."""
        await asyncio.gather(
            *(worker.flush.remote() for worker in self.workers), return_exceptions=True
        )
        await self._write([], drain=True)
        try:  # the workers' notes of what they just wrote travel on their chunk calls
            await asyncio.wait_for(self.all_committed.wait(), 1.0)
        except TimeoutError:
            pass  # episodes still finishing (an interrupted run): counted when they land
        return self.writer.rows_written + self.worker_rows

    def progress(self) -> RunSnapshot:
        """The current batch's figures so far (what the driver's progress display shows)."""
        return RunSnapshot(**self.run_stats.snapshot(), **self._output_figures())

    def _output_figures(self) -> dict[str, Any]:
        """Queue and writer figures, shared by ``progress`` and ``stats``."""
        figures = self.writer.figures()
        figures.parts = len(self.part_paths)
        figures.rows += self.worker_rows
        figures.seconds += self.worker_seconds
        figures.buffered_rows += self.uncommitted
        return {
            "queued": self.queue.qsize(),
            "rows_written": self.writer.rows_written + self.worker_rows,
            "writer": figures,
        }

    async def _run_specs(self, specs: list[EpisodeSpec], write: bool) -> list[dict[str, Any]]:
        """Run episodes through the queue and hand their rows back (in any order)."""
        waiter = _Waiter(specs, write)
        for spec in specs:
            self.waiters[id(spec)] = waiter
        try:
            await self.submit(specs)
            return await waiter.done
        finally:
            for spec in specs:
                self.waiters.pop(id(spec), None)

    def _deliver(self, specs: list[EpisodeSpec], result: ChunkRows) -> pa.Table:
        """Give generate() callers their rows (``specs`` in the order of ``result``'s rows:
        those the worker did not write); returns the rows to write."""
        waiters = [self.waiters.pop(id(spec), None) for spec in specs]
        table = result.table()
        if not specs:
            return table
        if not any(waiters):  # collect(): the table goes to the writer as it came
            return table
        keep = []
        for index, (waiter, row) in enumerate(zip(waiters, table.to_pylist(), strict=True)):
            if waiter is not None:
                waiter.add(row)
            if waiter is None or waiter.write:
                keep.append(index)
        return table.take(keep)

    async def _feed(self) -> None:
        """Send queued episodes to the worker with the most room, in batches, while each
        worker holds fewer than its share of ``concurrency`` plus its part of the reserve
        (``worker_limits``)."""
        while True:
            chunk = [await self.queue.get()]
            # A whole batch when the queue has one (one Ray call for more episodes), even if
            # that waits for room: the workers hold their reserve meanwhile.
            index, size = await self._worker_with_room(chunk)
            while len(chunk) < size:
                chunk.append(self.queue.get_nowait())
            self.load[index] += len(chunk)
            self.run_stats.in_flight += len(chunk)
            call = asyncio.create_task(self._run_chunk(index, chunk))
            self.calls.add(call)
            call.add_done_callback(self.calls.discard)

    async def _worker_with_room(self, chunk: list[EpisodeSpec]) -> tuple[int, int]:
        """(the worker to send to, how many episodes to send it): waits until a worker has
        room for a batch, or for all that is queued when that is less (``worker_with_room``).
        Only the feeder takes from the queue, so the episodes counted here are still there."""
        while True:
            reserve, workers = self.refill.reserve(), len(self.workers)
            concurrency = self.config.concurrency
            limits = [
                worker_limits(concurrency, workers, i, self.chunk, reserve) for i in range(workers)
            ]
            size = min(limits[0][1], len(chunk) + self.queue.qsize())
            index = worker_with_room([most for most, _ in limits], self.load, size)
            if index is not None:
                return index, size
            self.room.clear()
            await self.room.wait()

    async def _run_chunk(self, index: int, chunk: list[EpisodeSpec]) -> None:
        """One streaming worker call. The worker writes the rows of the episodes no caller
        waits on; the others' rows come back. A dead or restarting worker gets the episodes
        whose rows are in no part again (those it had finished are not counted twice), as
        often as it takes Ray to bring it back, up to ``workers.restart_deadline_s``
        (minutes: a loaded machine restarts an actor slowly); only past that do they end as
        error rows, written here."""
        worker, pending, error = self.workers[index], list(chunk), ""
        # Decided once, before the first send: the worker writes these episodes' rows.
        written = {id(spec) for spec in chunk if id(spec) not in self.waiters}
        counted: set[int] = set()  # finished, figures counted (their rows may be uncommitted)
        holding: set[int] = set()  # counted, sent again: they hold slots again until finished
        deadline = time.monotonic() + self.config.workers.restart_deadline_s
        for attempt in itertools.count():
            sent = pending
            holding = {id(spec) for spec in sent if id(spec) in counted}
            self.load[index] += len(holding)
            writes = [i for i, spec in enumerate(sent) if id(spec) in written]
            try:
                async for ref in worker.run.remote(sent, self.weights.state(), self.target, writes):
                    result: ChunkRows = await ref
                    finished = [sent[i] for i in result.indices]
                    back = {id(sent[i]) for i in result.returned}  # rows that came back
                    if finished:
                        holding.difference_update(id(spec) for spec in finished)
                        await self._finish(index, finished, result, back, counted)
                    if result.committed:
                        self._committed(result, sent, counted)
                    done = back | {id(sent[i]) for i in result.committed}
                    pending = [spec for spec in pending if id(spec) not in done]
                if not pending:
                    return
                error = f"worker ended its call with {len(pending)} episodes unanswered"
                break
            except (RayActorError, ActorUnavailableError) as exc:
                self.load[index] -= len(holding)  # held again by the next send, if any
                holding = set()
                pause = _RESEND_BACKOFF_S[min(attempt, len(_RESEND_BACKOFF_S) - 1)]
                if time.monotonic() + pause > deadline:
                    error = (
                        f"worker actor still unavailable after {attempt + 1} attempts over "
                        f"workers.restart_deadline_s={self.config.workers.restart_deadline_s:g}: "
                        f"{exc}"
                    )
                    break
                logger.warning("worker %s unavailable (%s); resending in %.1fs", index, exc, pause)
                await asyncio.sleep(pause)
            except Exception as exc:
                error = f"worker failed: {type(exc).__name__}: {exc}"
                break
        rows = [failed_trajectory(spec, "", error).to_row() for spec in pending]
        result = ChunkRows.from_rows(rows, list(range(len(rows))))
        # Already counted: their figures stand; the error row replaces the row that was lost.
        again = [spec for spec in pending if id(spec) in counted]
        self.load[index] += len(again) - len(holding)
        self._uncommitted(-len(again))
        await self._finish(index, pending, result, {id(spec) for spec in pending}, counted)

    def _committed(self, result: ChunkRows, sent: list[EpisodeSpec], counted: set[int]) -> None:
        """A worker's parts now hold these episodes' rows: count them and their parts."""
        self._uncommitted(-sum(1 for i in result.committed if id(sent[i]) in counted))
        self.worker_rows += len(result.committed)
        self.worker_seconds += result.write_seconds
        for part in result.parts:
            self.part_paths.setdefault(part)

    def _uncommitted(self, change: int) -> None:
        self.uncommitted += change
        if self.uncommitted:
            self.all_committed.clear()
        else:
            self.all_committed.set()

    async def _finish(
        self,
        index: int,
        specs: list[EpisodeSpec],
        result: ChunkRows,
        back: set[int],
        counted: set[int],
    ) -> None:
        """Free the slots of finished episodes; count them (once: an episode played again
        after its worker died is not counted twice), deliver and write the rows that came
        back (``back``: those episodes; the worker writes the others' rows)."""
        self.load[index] -= len(specs)
        self.room.set()
        fresh = [k for k, spec in enumerate(specs) if id(spec) not in counted]
        counted.update(id(specs[k]) for k in fresh)
        summaries = result.summaries
        if len(fresh) < len(specs):
            summaries = [summaries[k] for k in fresh]
        self._uncommitted(sum(1 for k in fresh if id(specs[k]) not in back))
        self.run_stats.in_flight -= len(fresh)
        self.refill.observe(summaries, time.time())
        self.run_stats.add(summaries)
        buffered = self.writer.buffered_rows + self.uncommitted
        self.metrics.on_rows(summaries, self.run_stats.in_flight, buffered)
        try:
            returned = [spec for spec in specs if id(spec) in back]
            await self._write(self._deliver(returned, result))
        except Exception:
            pass  # self.failure holds it; finish() raises it to the driver
        finally:
            self.completed += len(fresh)
            if self.completed == self.submitted:
                self.all_done.set()

    async def _write(self, rows: pa.Table | list[dict[str, Any]], drain: bool = False) -> None:
        async with self.write_lock:
            due = self.writer.add(rows) + (self.writer.drain() if drain else [])
            for table in due:
                try:
                    path = await asyncio.to_thread(self.writer.write, table)
                except Exception as exc:
                    self.failure = exc
                    raise
                self.part_paths.setdefault(str(path))

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.output.flush_interval_s))
            self.metrics.set_load(self.run_stats.in_flight, self.writer.buffered_rows)
            try:
                await self._write([])
            except Exception:
                return  # self.failure holds it; finish() raises it to the driver


class _Waiter:
    """Rows of one ``generate`` round, collected as their chunks come back."""

    def __init__(self, specs: list[EpisodeSpec], write: bool) -> None:
        self.specs = specs  # keeps the specs alive, so their ids stay unique while waited on
        self.write = write
        self.rows: list[dict[str, Any]] = []
        self.done: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) == len(self.specs) and not self.done.done():
            self.done.set_result(self.rows)
