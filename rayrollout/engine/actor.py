"""The engine actor: owns the agent pool, the environment registry of what is up, and the writer.

Named ``engine`` in the run's namespace, so drivers and training loops find it with
``ray.get_actor("engine", namespace=NS)``. Work arrives through ``submit`` (which waits while
the queue is full: backpressure, not timeouts); a feeder takes chunks off the queue as
episode slots (``concurrency``) free up and sends each to the least-loaded agent in one Ray
call. The agent streams a chunk's rows back as its episodes finish (a Ray streaming
generator), so a slow episode never holds its chunk's finished slots; each batch goes to
the writer as it arrives. If the agent dies, only the episodes it had not yet handed back
are sent again, so no row is written twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pyarrow as pa
import ray
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError

from rayrollout.data.config import RunConfig
from rayrollout.data.schema import Task
from rayrollout.data.writer import PartWriter, make_sink, written_keys
from rayrollout.engine.agent import AgentActor, agent_name, resolve_hosting
from rayrollout.engine.chunks import ChunkRows
from rayrollout.engine.episode import EpisodeSpec, failed_trajectory
from rayrollout.engine.groups import GenerateResult, SamplingCounts, generate_groups
from rayrollout.engine.metrics import RunMetrics
from rayrollout.engine.placement import agent_actor_options
from rayrollout.engine.stats import RunStats
from rayrollout.engine.weights import WeightSync
from rayrollout.environment.hosting import (
    environment_app,
    environment_app_name,
    environment_deployment_options,
    environment_route,
)
from rayrollout.environment.registry import load_environment
from rayrollout.policy.gate import PauseMode

__all__ = ["ENGINE_NAME", "EngineActor"]

ENGINE_NAME = "engine"
_AGENT_CALL_ATTEMPTS = 3
logger = logging.getLogger(__name__)


def chunk_size(concurrency: int, num_agents: int) -> int:
    """Most episodes per agent call: enough to amortize the call, few enough to spread the
    work over the agents."""
    return max(1, min(32, concurrency // (num_agents * 4)))


@ray.remote(num_cpus=0, max_concurrency=10_000)
class EngineActor:
    """Runs episodes on the agent pool and streams their rows to the output folder."""

    def __init__(
        self, config: RunConfig, policy_url: str, run_id: str, detached: bool = False
    ) -> None:
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        self.config = config
        self.policy_url = policy_url
        self.detached = detached  # started by `rayrollout up`: drivers attach, never kill it
        self.agents = [
            AgentActor.options(
                name=agent_name(i),
                namespace=config.namespace,
                max_concurrency=100_000,
                **agent_actor_options(config, {"num_cpus": config.agents.num_cpus}),
            ).remote(agent_name(i), config, policy_url)
            for i in range(config.agents.num_agents)
        ]
        out = config.output
        self.sink = make_sink(out.dir, out.format, run_id)
        self.writer = PartWriter(self.sink, out.rows_per_part, out.flush_interval_s)
        self.stats = RunStats()
        self.metrics = RunMetrics(config.namespace)
        self.chunk = chunk_size(config.concurrency, config.agents.num_agents)
        self.queue: asyncio.Queue[EpisodeSpec] = asyncio.Queue(maxsize=2 * config.concurrency)
        self.ready_envs: set[str] = set()
        self.env_lock = asyncio.Lock()
        self.write_lock = asyncio.Lock()
        self.feeder: asyncio.Task[None] | None = None
        self.calls: set[asyncio.Task[None]] = set()  # agent calls in flight
        self.load = [0] * len(self.agents)  # episodes in flight per agent
        self.slots: asyncio.Semaphore | None = None
        self.flusher: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        self.submitted = 0
        self.completed = 0
        self.all_done = asyncio.Event()
        self.all_done.set()
        self.batch_first_part = 0
        self.weights = WeightSync(config, policy_url, self.agents)
        self.sampling = SamplingCounts()
        self.waiters: dict[int, _Waiter] = {}  # id(spec) -> the generate() call awaiting it
        # generate(write=True): the next free sample index per task id, so (task_id,
        # sample_index) stays unique on disk across training steps (read from disk once).
        self.next_sample: dict[str, int] | None = None

    async def start(self) -> list[str]:
        """Wait for the agents and open the output; returns the agents' names."""
        names = await asyncio.gather(*(agent.ready.remote() for agent in self.agents))
        await asyncio.to_thread(self.sink.start)
        self.slots = asyncio.Semaphore(self.config.concurrency)
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
            "num_agents": len(self.agents),
        }

    async def ensure_environments(self, names: list[str]) -> None:
        """Deploy these environments now (``rayrollout up``) rather than at their first task."""
        for name in names:
            await self._ensure_environment(name)

    def begin(self) -> None:
        """Start a new batch of work (a ``collect``): fresh figures, parts counted from here."""
        self.stats = RunStats()
        self.batch_first_part = len(self.writer.paths)

    async def submit(self, specs: list[EpisodeSpec]) -> None:
        """Queue episodes; waits while the queue is full."""
        if self.failure is not None:
            raise self.failure
        for env in {s.task.environment for s in specs} - self.ready_envs:
            await self._ensure_environment(env)
        self.submitted += len(specs)
        self.metrics.on_submit([s.task.environment for s in specs])
        self.all_done.clear()
        for spec in specs:
            spec.queued_at = time.time()
            await self.queue.put(spec)

    async def finish(self) -> dict[str, Any]:
        """Wait for every episode submitted so far, write what is buffered, return the figures.

        The engine stays up for the next batch; ``close`` releases the output folder.
        """
        await self.all_done.wait()
        await self._write([], drain=True)
        if self.failure is not None:
            raise self.failure
        snapshot = self.progress()
        snapshot["parts"] = [str(p) for p in self.writer.paths[self.batch_first_part :]]
        return snapshot

    async def close(self) -> None:
        """Stop the feeder and the agent calls; complete the output (releases the lock)."""
        for task in [self.feeder, *self.calls, self.flusher]:
            if task is not None:
                task.cancel()
        if self.failure is not None:
            self.sink.failed(self.failure)
        else:
            self.sink.complete()

    async def flush(self) -> int:
        """Write every buffered row now (an interrupted driver calls this); returns rows written."""
        await self._write([], drain=True)
        return self.writer.rows_written

    def progress(self) -> dict[str, Any]:
        return {**self.stats.snapshot(), **self._output_figures()}

    def _output_figures(self) -> dict[str, Any]:
        """Queue and writer figures, shared by ``progress`` and ``stats``."""
        return {
            "queued": self.queue.qsize(),
            "rows_written": self.writer.rows_written,
            "writer": self.writer.figures(),
        }

    # Training-loop interface (issue 5): a trainer finds this actor by name and calls these.

    async def generate(
        self,
        tasks: list[Task | dict[str, Any]],
        n: int,
        dynamic_sampling: bool | None = None,
        batch_size: int | None = None,
        max_extra_groups: int | None = None,
        write: bool | None = None,
    ) -> GenerateResult:
        """Run ``n`` samples of each task; return them grouped by task (GRPO groups).

        Each group carries its rewards' mean and std; every turn its ``policy_version``.
        ``dynamic_sampling`` drops zero-variance groups and tops the batch (``batch_size``
        groups, default all tasks) up from the tasks after it, then by sampling dropped
        tasks again, within ``max_extra_groups`` (``rayrollout.engine.groups``). ``write`` also
        sends the trajectories to the output folder; their sample indices then continue
        from the last one written for the task (this engine's calls and what the folder
        held before), so ``(task_id, sample_index)`` stays unique on disk across steps.
        Unset arguments come from the config's ``training`` section.

        Example:
            >>> engine = ray.get_actor("engine", namespace="rayrollout")  # doctest: +SKIP
            >>> result = ray.get(engine.generate.remote(tasks, n=8))  # doctest: +SKIP
            >>> [(g.task_id, g.reward_mean, g.reward_std) for g in result.groups]  # doctest: +SKIP
        """
        from rayrollout.data.tasks import parse_task_row

        settings = self.config.training
        parsed = [
            t
            if isinstance(t, Task)
            else parse_task_row(t, default_environment=self.config.environment, line=i)
            for i, t in enumerate(tasks, start=1)
        ]
        keep = settings.write_trajectories if write is None else write
        dynamic = settings.dynamic_sampling if dynamic_sampling is None else dynamic_sampling
        extra = settings.max_extra_groups if max_extra_groups is None else max_extra_groups
        taken = await self._samples_on_disk() if keep else {}
        first = {t.task_id: taken.get(t.task_id, 0) for t in parsed}

        async def run(specs: list[EpisodeSpec]) -> list[dict[str, Any]]:
            if keep:
                for spec in specs:
                    task_id = spec.task.task_id
                    taken[task_id] = max(taken.get(task_id, 0), spec.sample_index + 1)
            return await self._run_specs(specs, keep)

        result, episodes = await generate_groups(parsed, n, run, dynamic, batch_size, extra, first)
        self.sampling.add(result, episodes)
        return result

    async def pause(self, mode: PauseMode | None = None) -> dict[str, Any]:
        """Hold every new model call; calls in flight per ``mode`` (default: config's
        ``training.pause_mode``): 'wait', 'abort_and_retry' or 'continue'."""
        return await self.weights.pause(mode)

    async def resume(self) -> dict[str, Any]:
        """Let model calls go out again, under the current policy version."""
        return await self.weights.resume()

    async def update_weights(
        self, path: str | None = None, version: int | None = None
    ) -> dict[str, Any]:
        """Load a checkpoint folder (absolute path, safetensors) into every policy replica
        and move to ``version`` (default: the current one + 1); pauses around it unless
        already paused. Without ``path`` only the version moves (scripted policy, or a
        server the trainer updated itself)."""
        return await self.weights.update_weights(path, version)

    async def stats(self) -> dict[str, Any]:
        """Episodes done and in flight, throughput, reward, errors, per environment; the
        policy version and calls held or aborted; dynamic sampling counts."""
        snapshot = self.stats_snapshot()
        agents = await asyncio.gather(
            *(agent.policy_calls.remote() for agent in self.agents), return_exceptions=True
        )
        calls: dict[str, int] = {}
        for answer in agents:
            if isinstance(answer, dict):
                for key in ("in_flight", "calls", "held", "aborted", "stale_restarts"):
                    calls[key] = calls.get(key, 0) + answer[key]
        snapshot["policy_calls"] = calls
        return snapshot

    def stats_snapshot(self) -> dict[str, Any]:
        """``stats()`` without asking the agents (no awaits)."""
        snapshot = {**self.stats.summary(), **self._output_figures()}
        snapshot["policy"] = self.weights.snapshot()
        snapshot["dynamic_sampling"] = self.sampling.model_dump()
        return snapshot

    async def _samples_on_disk(self) -> dict[str, int]:
        """The next free sample index per task id in the output folder; the folder is read
        once, then the engine counts what its writing generate() calls start."""
        if self.next_sample is None:
            out = self.config.output
            on_disk = await asyncio.to_thread(written_keys, out.dir, out.format)
            self.next_sample = {}
            for task_id, index in on_disk:
                self.next_sample[task_id] = max(self.next_sample.get(task_id, 0), index + 1)
        return self.next_sample

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
        """Give generate() callers their rows (``specs`` in the order of ``result``'s rows);
        returns the rows to write."""
        waiters = [self.waiters.pop(id(spec), None) for spec in specs]
        table = result.table()
        if not any(waiters):  # collect(): the table goes to the writer as it came
            return table
        keep = []
        for index, (waiter, row) in enumerate(zip(waiters, table.to_pylist(), strict=True)):
            if waiter is not None:
                waiter.add(row)
            if waiter is None or waiter.write:
                keep.append(index)
        return table.take(keep)

    async def _ensure_environment(self, name: str) -> None:
        """Deploy a Serve-hosted environment the first time a task needs it."""
        async with self.env_lock:
            if name in self.ready_envs:
                return
            try:
                env_cls = load_environment(self.config.environment_config(name).path or name)
            except LookupError:
                self.ready_envs.add(name)  # its episodes end as errors naming the problem
                return
            if resolve_hosting(self.config, env_cls) == "serve":
                settings = self.config.environment_config(name)
                app = environment_app(
                    f"{env_cls.__module__}:{env_cls.__qualname__}",
                    num_replicas=settings.replicas,
                    num_cpus=settings.num_cpus,
                    options=environment_deployment_options(self.config, name),
                    session_idle_timeout_s=settings.session_idle_timeout_s,
                )
                app_name = environment_app_name(self.config.namespace, name)
                # The route serves NeMo Gym's HTTP protocol (see nemo_gym_routes.py).
                route = environment_route(self.config.namespace, name)
                await asyncio.to_thread(serve.run, app, name=app_name, route_prefix=route)
            self.ready_envs.add(name)

    async def _feed(self) -> None:
        """Send queued episodes to the least-loaded agent whenever slots are free."""
        assert self.slots is not None
        while True:
            spec = await self.queue.get()
            await self.slots.acquire()
            await asyncio.sleep(0)  # batches coming back free their slots first
            chunk = [spec]
            while len(chunk) < self.chunk and not self.queue.empty() and not self.slots.locked():
                await self.slots.acquire()  # free, so it does not wait
                chunk.append(self.queue.get_nowait())
            index = min(range(len(self.agents)), key=self.load.__getitem__)
            self.load[index] += len(chunk)
            self.stats.in_flight += len(chunk)
            call = asyncio.create_task(self._run_chunk(index, chunk))
            self.calls.add(call)
            call.add_done_callback(self.calls.discard)

    async def _run_chunk(self, index: int, chunk: list[EpisodeSpec]) -> None:
        """One streaming agent call; a dead or restarting agent gets the episodes it had not
        handed back again, then they end as errors."""
        agent, pending, error = self.agents[index], list(chunk), ""
        for attempt in range(_AGENT_CALL_ATTEMPTS):
            sent = pending
            try:
                async for ref in agent.run.remote(sent, self.weights.state()):
                    result: ChunkRows = await ref
                    finished = [sent[i] for i in result.indices]
                    done = {id(spec) for spec in finished}
                    pending = [spec for spec in pending if id(spec) not in done]
                    await self._finish(index, finished, result)
                if not pending:
                    return
                error = f"agent ended its call with {len(pending)} episodes unanswered"
                break
            except (ActorDiedError, ActorUnavailableError) as exc:
                error = f"agent actor unavailable after {attempt + 1} attempts: {exc}"
                await asyncio.sleep(0.5 * 2**attempt)
            except Exception as exc:
                error = f"agent failed: {type(exc).__name__}: {exc}"
                break
        rows = [failed_trajectory(spec, "", error).to_row() for spec in pending]
        await self._finish(index, pending, ChunkRows.from_rows(rows, list(range(len(rows)))))

    async def _finish(self, index: int, specs: list[EpisodeSpec], result: ChunkRows) -> None:
        """Free the slots of finished episodes; count, deliver and write their rows."""
        assert self.slots is not None
        self.load[index] -= len(specs)
        self.stats.in_flight -= len(specs)
        for _ in specs:
            self.slots.release()
        self.stats.add(result.summaries)
        self.metrics.on_rows(result.summaries, self.stats.in_flight, self.writer.buffered_rows)
        try:
            await self._write(self._deliver(specs, result))
        except Exception:
            pass  # self.failure holds it; finish() raises it to the driver
        finally:
            self.completed += len(specs)
            if self.completed == self.submitted:
                self.all_done.set()

    async def _write(self, rows: pa.Table | list[dict[str, Any]], drain: bool = False) -> None:
        async with self.write_lock:
            due = self.writer.add(rows) + (self.writer.drain() if drain else [])
            for table in due:
                try:
                    await asyncio.to_thread(self.writer.write, table)
                except Exception as exc:
                    self.failure = exc
                    raise

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.output.flush_interval_s))
            self.metrics.set_load(self.stats.in_flight, self.writer.buffered_rows)
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
