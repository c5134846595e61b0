"""The engine actor; one job: the control of the collect pipeline, from queue to committed rows.

Named ``engine`` in the run's namespace, so drivers and training loops find it with
``ray.get_actor("engine", namespace=NS)``. Work arrives through ``submit`` (which waits while
the queue is full: backpressure, not timeouts); a feeder takes chunks off the queue while
each worker holds fewer than its share of ``concurrency`` plus its part of the ``reserve``,
and sends each to the worker with the most room in one Ray call. The worker writes the rows
of a ``collect`` to its own parts (``worker_parts``) and reports, on one stream per worker
(``worker_session``) and at most one message per 50 ms, which finished and later which a
renamed part holds: rows never pass through this actor, which keeps the queue, the counts
and the slots. Rows a caller waits on (``generate``, the service's stream) come back as
Arrow and are written here when asked. If the worker dies, a new session gets the episodes
whose rows are in no part yet again (a restarted worker answers those a part of its killed
process holds from that part), so no row is written twice. Nothing is kept per task beyond
the episodes in flight (their specs, and a ``generate`` call's waiter) and
``next_sample``'s digests, so a run's memory does not grow with its task set.

The actor's other two jobs have their own modules: the training-loop methods (``generate``,
``pause``, ``resume``, ``update_weights``, ``stats``) in ``training``, and putting
environments up on Serve in ``deploy``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import time
import uuid
from dataclasses import dataclass
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
from rayrollout.engine.chunks import ChunkRows, WorkerReport
from rayrollout.engine.deploy import EnvironmentDeployer
from rayrollout.engine.episode_spec import EpisodeSpec, failed_trajectory
from rayrollout.engine.feeding import (
    Refill,
    chunk_size,
    worker_limits,
    worker_name,
    worker_share,
    worker_with_room,
)
from rayrollout.engine.groups import SamplingCounts
from rayrollout.engine.metrics import EpisodeHistograms, RunMetrics
from rayrollout.engine.placement import worker_actor_options
from rayrollout.engine.run_figures import RunSnapshot
from rayrollout.engine.stats import RunStats
from rayrollout.engine.streaming import StreamingAPI
from rayrollout.engine.tally import Tally
from rayrollout.engine.training import TrainingLoopAPI
from rayrollout.engine.weights import WeightSync
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
    # Imported here: the worker's module brings the episode loop, agents, environment
    # sessions and Serve batching, which an engine actor whose driver starts the workers
    # never needs.
    from rayrollout.engine.worker import WorkerActor, WorkerSpec

    return [
        WorkerActor.options(  # type: ignore[attr-defined]  # a Ray actor class (stubs)
            name=worker_name(i),
            namespace=config.namespace,
            max_concurrency=100_000,
            **worker_actor_options(config, {"num_cpus": config.workers.num_cpus}),
        ).remote(
            WorkerSpec(
                worker_name(i),
                config,
                policy_url,
                policy_key,
                worker_share(config.concurrency, config.workers.num_workers, i),
            )
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
        self.histograms = EpisodeHistograms(config.namespace)  # of the episodes ended here
        self.chunk = chunk_size(config.concurrency, config.workers.num_workers)
        self.queue: asyncio.Queue[EpisodeSpec] = asyncio.Queue(maxsize=2 * config.concurrency)
        # Without a token given, a fresh one nobody holds: the routes answer no one over HTTP.
        token = route_token.get_secret_value() if route_token else new_token()
        self.environments = EnvironmentDeployer(config, RouteAuth.bearer(token))
        self.write_lock = asyncio.Lock()
        self.feeder: asyncio.Task[None] | None = None
        self.calls: set[asyncio.Task[None]] = set()  # worker calls in flight
        self.links = [_Link() for _ in self.workers]  # a session with each worker
        self.serving: list[asyncio.Task[None]] = []  # their report streams
        self.seqs = itertools.count()  # numbers the episodes sent to workers
        self.messages = 0  # Ray messages between this actor and the workers
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
        self.serving = [asyncio.create_task(self._serve(i)) for i in range(len(self.workers))]
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
        self.messages = 0
        self.batch_first_part = len(self.part_paths)

    async def submit(self, specs: list[EpisodeSpec]) -> None:
        """Queue episodes; waits while the queue is full.

        Episodes of an environment still to be put up on Serve wait for its deployment
        (seconds: a replica process starts); the batch's other episodes are queued while it
        deploys, so a run's inline environments play from the first second.
        """
        if self.failure is not None:
            raise self.failure
        to_deploy = self.environments.to_deploy(s.environment for s in specs)
        if to_deploy:
            deploying = asyncio.ensure_future(self.environments.ensure_all(sorted(to_deploy)))
            await self._queue([s for s in specs if s.environment not in to_deploy])
            await deploying  # a failed deployment is the caller's error
            specs = [s for s in specs if s.environment in to_deploy]
        await self._queue(specs)

    async def _queue(self, specs: list[EpisodeSpec]) -> None:
        """Count episodes as submitted and put them on the queue (waits while it is full)."""
        if not specs:
            return
        self.submitted += len(specs)
        self.metrics.on_submit([s.environment for s in specs])
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
        for task in [self.feeder, *self.calls, *self.serving, self.flusher]:
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
        try:  # the workers' notes of what they just wrote travel on their reports
            await asyncio.wait_for(self.all_committed.wait(), 1.0)
        except TimeoutError:
            pass  # episodes still finishing (an interrupted run): counted when they land
        return self.writer.rows_written + self.worker_rows

    def progress(self) -> RunSnapshot:
        """The current batch's figures so far (what the driver's progress display shows)."""
        return RunSnapshot(
            **self.run_stats.snapshot(), **self._output_figures(), worker_messages=self.messages
        )

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

    def _deliver(self, specs: list[EpisodeSpec], table: pa.Table) -> pa.Table:
        """Give generate() callers their rows (``specs`` in the order of ``table``'s rows:
        those the worker did not write); returns the rows to write."""
        waiters = [self.waiters.pop(id(spec), None) for spec in specs]
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
            out = self.links[index].out
            seqs = []
            for spec in chunk:
                seq = next(self.seqs)
                # Decided once, before the first send: the worker writes these rows.
                out[seq] = _Sent(spec, id(spec) not in self.waiters)
                seqs.append(seq)
            self._spawn(self._send(index, seqs))

    def _spawn(self, coroutine: Any) -> None:
        call = asyncio.create_task(coroutine)
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

    async def _send(self, index: int, seqs: list[int]) -> None:
        """Send these episodes to worker ``index`` in its current session, once each: an
        episode already sent on it (a resend after a restart raced this call) is not."""
        link = self.links[index]
        await link.opened.wait()
        session, episodes, counted = link.session, [], []
        for seq in seqs:
            sent = link.out.get(seq)
            if sent is not None and sent.session != session:
                sent.session = session
                episodes.append((seq, sent.spec, sent.write))
                if sent.counted:  # finished on a lost session: the worker leaves it untallied
                    counted.append(seq)
        if not episodes:
            return
        self.messages += 2  # the call and its answer
        # Pickled here, as bytes: Ray pickles a call's arguments with cloudpickle, whose
        # Python hook on every object made pydantic specs the largest cost of a send.
        payload = pickle.dumps((episodes, counted), protocol=5)
        try:
            await self.workers[index].take.remote(session, payload, self.weights.state())
        except Exception:
            pass  # a dead worker ends its report stream too: _serve sends these again

    async def _serve(self, index: int) -> None:
        """Keep a session open with worker ``index`` and take in its reports. If the worker
        dies, a new session gets every episode whose row is in no part again (a restarted
        worker answers those a part of its killed process holds from that part; those it
        had finished are not counted twice), as often as it takes Ray to bring it back, up
        to ``workers.restart_deadline_s`` (minutes: a loaded machine restarts an actor
        slowly); only past that do they end as error rows, written here."""
        link, worker = self.links[index], self.workers[index]
        attempt, deadline = 0, None
        while True:
            try:
                session = uuid.uuid4().hex
                self.messages += 2
                await worker.open.remote(session, self.target, self.weights.state())
                link.session = session
                link.opened.set()
                await self._send(index, list(link.out))  # those a dead session held
                async for ref in worker.reports.remote(session):
                    report: WorkerReport = await ref
                    self.messages += 1
                    if report.finished:
                        attempt, deadline = 0, None
                    await self._on_report(index, report)
                raise _SessionLost(f"worker {index} no longer holds its session")
            except (RayActorError, ActorUnavailableError, _SessionLost) as exc:
                link.opened.clear()
                for sent in link.out.values():  # played again: they hold slots again
                    if not sent.holds:
                        sent.holds = True
                        self.load[index] += 1
                restart_s = self.config.workers.restart_deadline_s
                deadline = deadline or time.monotonic() + restart_s
                pause = _RESEND_BACKOFF_S[min(attempt, len(_RESEND_BACKOFF_S) - 1)]
                attempt += 1
                if time.monotonic() + pause > deadline:
                    await self._give_up(
                        index,
                        f"worker actor still unavailable after {attempt} attempts over "
                        f"workers.restart_deadline_s={restart_s:g}: {exc}",
                    )
                    attempt, deadline = 0, None
                else:
                    logger.warning("worker %s unavailable (%s); resend in %.1fs", index, exc, pause)
                await asyncio.sleep(pause)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                link.opened.clear()
                await self._give_up(index, f"worker failed: {type(exc).__name__}: {exc}")
                await asyncio.sleep(_RESEND_BACKOFF_S[0])

    async def _on_report(self, index: int, report: WorkerReport) -> None:
        """Free the slots of finished episodes; count them (once: an episode played again
        after its worker died is not counted twice, and its worker left it out of the
        report's tally); deliver and write the rows that came back; count the rows the
        worker's parts now hold."""
        out, returned = self.links[index].out, set(report.returned)
        freed = fresh = uncommitted = 0
        for seq in report.finished:
            sent = out.get(seq)
            if sent is None:
                continue  # ended here already (given up)
            if sent.holds:
                sent.holds = False
                freed += 1
            if not sent.counted:
                sent.counted = True
                fresh += 1
                uncommitted += seq not in returned
        if fresh != report.tally.episodes:
            logger.warning(
                "worker %s tallied %d finished episodes where the engine counted %d: the "
                "run's figures are off by the difference",
                index,
                report.tally.episodes,
                fresh,
            )
        keep = [k for k, seq in enumerate(report.returned) if seq in out]
        back = [out.pop(report.returned[k]).spec for k in keep]
        committed = [out.pop(seq) for seq in report.committed if seq in out]
        uncommitted -= sum(1 for sent in committed if sent.counted)
        self.worker_rows += len(committed)
        self.worker_seconds += report.write_seconds
        for part in report.parts:
            self.part_paths.setdefault(part)
        self._uncommitted(uncommitted)
        table = None
        if back:  # an empty table of the row schema costs more than the rest of a report
            table = report.table()
            if len(keep) < table.num_rows:
                table = table.take(keep)
        await self._count(index, freed, fresh, report.tally, back, table)

    async def _give_up(self, index: int, error: str) -> None:
        """End every episode out at worker ``index`` with an error row, written here (those
        already counted keep their figures: the error row replaces the row that was lost)."""
        out = self.links[index].out
        ended = list(out.values())
        out.clear()
        if not ended:
            return
        rows = [failed_trajectory(sent.spec, "", error).to_row() for sent in ended]
        table = ChunkRows.from_rows(rows, list(range(len(rows)))).table()
        fresh = [row for row, sent in zip(rows, ended, strict=True) if not sent.counted]
        for row in fresh:
            self.histograms.observe(row)
        self._uncommitted(-sum(1 for sent in ended if sent.counted))
        freed = sum(1 for sent in ended if sent.holds)
        tally = Tally.of(fresh)
        await self._count(index, freed, len(fresh), tally, [sent.spec for sent in ended], table)

    async def _count(
        self,
        index: int,
        freed: int,
        fresh: int,
        tally: Tally,
        back: list[EpisodeSpec],
        table: pa.Table | None,
    ) -> None:
        """Free ``freed`` slots of worker ``index``; count ``fresh`` episodes, whose sums
        ``tally`` holds; deliver and write ``table``, the rows of ``back`` (in that order)."""
        self.load[index] -= freed
        self.room.set()
        self.run_stats.in_flight -= fresh
        episodes = tally.episodes
        if episodes:
            seconds = sum(env.seconds_total for env in tally.by_env.values())
            self.refill.observe_batch(seconds / episodes, tally.ends, time.time())
            self.run_stats.merge(tally)
            buffered = self.writer.buffered_rows + self.uncommitted
            self.metrics.on_tally(tally, self.run_stats.in_flight, buffered)
        try:
            if back and table is not None:
                await self._write(self._deliver(back, table))
        except Exception:
            pass  # self.failure holds it; finish() raises it to the driver
        finally:
            self.completed += fresh
            if self.completed == self.submitted:
                self.all_done.set()

    def _uncommitted(self, change: int) -> None:
        self.uncommitted += change
        if self.uncommitted:
            self.all_committed.clear()
        else:
            self.all_committed.set()

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


@dataclass(eq=False)
class _Sent:
    """An episode out at a worker, until a part holds its row or its row came back."""

    spec: EpisodeSpec
    write: bool  # the worker writes its row (no caller waits on it)
    session: str = ""  # the worker session it was last sent on
    holds: bool = True  # holds a slot of its worker (``load``) until it finishes
    counted: bool = False  # finished, its figures counted (its row may be uncommitted)


class _Link:
    """The engine's side of its session with one worker: the episodes out there by the
    engine's sequence number, and the session they go to."""

    def __init__(self) -> None:
        self.session = ""
        self.opened = asyncio.Event()
        self.out: dict[int, _Sent] = {}


class _SessionLost(Exception):
    """A worker's report stream ended: the process that held the session is gone."""


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
