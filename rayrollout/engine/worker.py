"""Worker actors: async Ray actors that each play hundreds of episodes at once.

A worker takes batches of episodes into its one session with the engine
(``worker_session``), plays each with the agent its task names, writes the rows the engine
asks it to write to its own parts (``worker_parts``) and reports on one stream which
finished and which are committed, with the rows a caller waits on as Arrow (``chunks``).
Agents are built once per worker; Serve-hosted environments are reached through cached
handles.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import ray
from pydantic import SecretStr

from rayrollout.agentkit import Agent
from rayrollout.agentkit.episode import GatewayOpener
from rayrollout.agentkit.gateway import Gateway
from rayrollout.agentkit.registry import agent_spec, resolve_agent
from rayrollout.data.config import PauseMode, RunConfig
from rayrollout.engine.chunks import WorkerReport, warm_arrow
from rayrollout.engine.episode_frame import run_episode
from rayrollout.engine.episode_spec import EpisodeSpec, failed_trajectory
from rayrollout.engine.feeding import WORKER_PREFIX
from rayrollout.engine.metrics import EpisodeHistograms
from rayrollout.engine.worker_parts import Finished, PartsTarget, WorkerParts
from rayrollout.engine.worker_session import WorkerSession
from rayrollout.envkit import Environment
from rayrollout.envkit.nemo_gym.client import NemoGymConnections, remote_environment
from rayrollout.envkit.registry import environment_spec
from rayrollout.envkit.serve_batching import BatchingHandle
from rayrollout.envkit.sessions import (
    EnvSession,
    InlineSession,
    ServeSession,
    resolve_hosting,
)
from rayrollout.gc_tuning import tune_gc
from rayrollout.policy.client import PolicyClient
from rayrollout.policy.gate import PolicyGate

__all__ = ["WorkerActor", "WorkerRunner", "WorkerSpec"]

logger = logging.getLogger(__name__)
_EPISODE_ATTEMPTS = 3  # tries of an episode whose environment replica died mid-episode
_LINGER_S = 0.005  # episodes of a chunk finishing this close together go back as one batch


class RunningSlot:
    """One of a worker's running slots (its share of ``concurrency``), held by an episode
    while its agent plays: model calls and tool steps. It is given back before the verifier
    runs and the row is built, so the next waiting episode's first request reaches the policy
    while this one is scored; otherwise every slot of the policy sat empty for that time at
    the end of every episode (a few percent of a short episode's length, more on a loaded
    machine). Episodes being scored are still counted by the engine against ``concurrency``
    plus the workers' reserve, so the total stays bounded."""

    def __init__(self, semaphore: asyncio.Semaphore) -> None:
        self.semaphore = semaphore
        self.held = False

    async def take(self) -> None:
        if not self.held:
            await self.semaphore.acquire()
            self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.semaphore.release()


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker is made of: its name (``worker:<i>``), the run's config, the policy's
    URL and key, and ``max_running``, its share of the run's ``concurrency``
    (``worker_share``; default: an even share).

    ``policy_key`` is the driver's policy API key (``secrets.policy_key``): the worker is the
    only process that calls the policy, so the only one given it. Ray keeps the spec with
    the actor's constructor arguments, so a restarted worker has the key again.
    """

    name: str
    config: RunConfig
    policy_url: str
    policy_key: SecretStr | None = None
    max_running: int | None = None


class WorkerRunner:
    """The worker's logic, usable without Ray (tests, benchmarks of the bare loop)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.name = spec.name
        self.config = config = spec.config
        # One connection per episode this worker may hold in flight, so no call queues for one.
        per_worker = -(-config.concurrency // config.workers.num_workers)
        # The engine sends more episodes than may run (so that no slot idles while a batch
        # of rows makes its round trip to the engine and the next chunk comes back); this
        # worker starts at most its share of ``concurrency`` at once, the rest wait here.
        self.running = asyncio.Semaphore(spec.max_running or per_worker)
        # Every model call passes the gate: pause/resume for weight updates, versions per turn.
        self.gate = PolicyGate(config.training.max_staleness)
        # The key as data, never in this process's environment (engine/secret_env.py): tool
        # subprocesses of inline environments inherit that environment.
        key = spec.policy_key.get_secret_value() if spec.policy_key is not None else None
        self.policy = PolicyClient(config.policy, spec.policy_url, per_worker + 16, self.gate, key)
        self.handles: dict[str, Any] = {}
        self.env_classes: dict[str, type[Environment]] = {}  # by registered name, once loaded
        self.batchers: dict[str, BatchingHandle] = {}
        self.remote = NemoGymConnections()
        self.agents: dict[str, Agent] = {}  # by registered name, built once per worker
        # The recording gateway of programs that call the model themselves (the program
        # agent): one server per worker, bound only when an episode first opens it.
        self.gateway: GatewayOpener | None = Gateway()

    def _agent(self, name: str) -> Agent:
        """The agent ``name`` (the task's, the run's or the built-in loop), built once."""
        agent = self.agents.get(name)
        if agent is None:
            agent = agent_spec(name, self.config.agent_config(name)).create()
            self.agents[name] = agent
        return agent

    def _env_class(self, name: str) -> type[Environment]:
        """The class of environment ``name`` (the task's name, which picks its settings too);
        loaded once, so an episode pays a dict lookup. Unknown names raise every time."""
        env_cls = self.env_classes.get(name)
        if env_cls is None:
            settings = self.config.environment_config(name)
            if settings.url is not None:
                env_cls = remote_environment(settings)  # by what the server speaks
            else:
                env_cls = environment_spec(name, settings).load()
            self.env_classes[name] = env_cls
        return env_cls

    def _session(
        self, env_cls: type[Environment], env_name: str, spec: EpisodeSpec, episode_id: str
    ) -> EnvSession:
        settings = self.config.environment_config(env_name)
        hosting = resolve_hosting(settings, env_cls)
        if hosting == "remote":  # a NeMo Gym resources server, over HTTP
            return self.remote.session(env_name, settings, spec.task, episode_id)
        if hosting == "inline":
            return InlineSession(env_cls, spec.task, settings.args)
        handle = self.handles.get(env_name)
        if handle is None:
            # Imported here, not at the top: Ray Serve and the environment server are about
            # 0.7 s of imports in every worker, and a run with inline or URL environments
            # never touches them (its first episode starts that much sooner).
            from ray import serve

            from rayrollout.envkit.server import environment_app_name

            # Serve's first import in a process sets its logger to INFO, so a level set in
            # the constructor was undone here, and each worker's router lines ("Started
            # <SharedRouterLongPollClient>", "ConsistentHashRouter initialized") went to the
            # driver; Ray held the second worker's copy back as a repeat and printed it after
            # the run's summary. Set after the import, WARNING holds.
            logging.getLogger("ray.serve").setLevel(logging.WARNING)

            app = environment_app_name(self.config.namespace, env_name)
            # Results by value, not through the object store: about 40% less caller CPU per
            # call for the small payloads environments exchange (notes/ray-costs.md).
            handle = serve.get_app_handle(app).options(_by_reference=False)
            self.handles[env_name] = handle
            self.batchers[env_name] = BatchingHandle(handle)
        return ServeSession(
            handle, env_cls.is_stateful(), episode_id, spec.task, self.batchers[env_name]
        )

    async def run_admitted(self, spec: EpisodeSpec) -> dict[str, Any]:
        """``run_one`` once one of this worker's running slots is free; the slot goes to the
        next waiting episode as soon as this one's agent loop is over (``RunningSlot``)."""
        slot = RunningSlot(self.running)
        try:
            return await self.run_one(spec, slot)
        finally:
            slot.give_back()

    async def run_one(self, spec: EpisodeSpec, slot: RunningSlot | None = None) -> dict[str, Any]:
        """One episode; played again from the start (a new episode id) when its environment
        replica died under it or the policy moved on more than ``max_staleness`` versions,
        up to ``_EPISODE_ATTEMPTS`` times. Only the last try is kept. Each try holds
        ``slot`` (when given) while its agent plays."""
        try:
            declares: type[Environment] | None = self._env_class(spec.task.environment)
        except Exception:  # unknown env: its episode fails below, naming it
            declares = None
        # The row's agent, the run's, the environment's own default, then tool_loop.
        played_by = resolve_agent(spec.task, self.config.agent, declares)
        try:
            agent = self._agent(played_by)
        except Exception as exc:  # unknown agent, args that do not fit: the episode fails
            error = f"agent '{played_by}' unavailable: {exc}"
            return failed_trajectory(spec, self.name, error, played_by).to_row()
        for attempt in range(1, _EPISODE_ATTEMPTS + 1):
            if slot is not None:
                await slot.take()
            episode_id = spec.new_episode_id()
            try:
                env_cls = self._env_class(spec.task.environment)
                session = self._session(env_cls, spec.task.environment, spec, episode_id)
            except Exception as exc:  # unknown env, Serve app not up: the episode fails
                error = f"environment unavailable: {exc}"
                return failed_trajectory(spec, self.name, error, played_by).to_row()
            trajectory = await run_episode(
                spec,
                env_cls,
                session,
                self.policy,
                self.config.episode,
                self.name,
                episode_id,
                agent,
                played_by,
                self.gateway,
                slot.give_back if slot is not None else None,
            )
            trajectory.policy_version = (
                trajectory.turns[0].policy_version if trajectory.turns else self.gate.version
            )
            stale = self.gate.take_stale(episode_id)
            if not session.lost and not stale:
                break
            if attempt == _EPISODE_ATTEMPTS:
                trajectory.error = f"{trajectory.error} (episode tried {attempt} times)"
        return trajectory.to_row()

    async def stream(
        self,
        specs: list[EpisodeSpec],
        policy_state: tuple[int, bool] | None = None,
        linger_s: float = _LINGER_S,
    ) -> AsyncIterator[tuple[list[int], list[dict[str, Any]]]]:
        """``play`` with every row handed back: ``(indices, rows)`` as episodes finish."""
        async for batch in self.play(specs, policy_state, linger_s):
            yield batch.indices, batch.rows

    async def play(
        self,
        specs: list[EpisodeSpec],
        policy_state: tuple[int, bool] | None = None,
        linger_s: float = _LINGER_S,
    ) -> AsyncIterator[Finished]:
        """Run a chunk of episodes concurrently; yield each batch that finishes as it does,
        one row per episode, failures included. ``policy_state`` (version, paused) is the
        engine's, for a worker that restarted.

        A chunk's slow episode does not hold the finished ones back: with episode times as
        uneven as RL rollouts' (a long tool call, a model that talks for ten turns), waiting
        for a whole chunk would leave most of its slots idle. Episodes finishing within
        ``linger_s`` of each other go back together.
        """
        if policy_state is not None:
            self.gate.sync(*policy_state)
        running = {
            asyncio.ensure_future(self.run_admitted(spec)): index
            for index, spec in enumerate(specs)
        }
        try:
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                finished = list(done)
                if linger_s and len(finished) < len(running):
                    await asyncio.sleep(linger_s)
                    finished = [task for task in running if task.done()]
                batch = Finished()
                for task in finished:
                    batch.indices.append(running.pop(task))
                    batch.rows.append(task.result())
                yield batch
        finally:
            for task in running:  # the call ended early: nobody takes these rows
                task.cancel()


@ray.remote(max_restarts=-1, max_task_retries=0)
class WorkerActor:
    """One worker of the pool (named ``worker:<i>`` in the run's namespace), made from a
    ``WorkerSpec``."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.runner = WorkerRunner(spec)
        self.writer = f"w{spec.name.removeprefix(WORKER_PREFIX)}"  # its parts: part-<run>-w0.<n>
        self.parts: dict[PartsTarget, WorkerParts] = {}
        self.opening = asyncio.Lock()  # concurrent calls open a target's writer once
        self.sessions: dict[str, WorkerSession] = {}  # the engine's, by id: one at a time
        self.histograms = EpisodeHistograms(spec.config.namespace)  # observed as episodes end
        warm_arrow()
        tune_gc()  # about a fifth of a worker's CPU went to the collector (gc_tuning)

    async def open(
        self, session: str, target: PartsTarget | None, policy_state: tuple[int, bool]
    ) -> bool:
        """Begin the engine's session ``session`` (one at a time: an earlier one's episodes
        stop); returns whether this worker writes rows to ``target``'s folder (only on the
        engine's node: elsewhere every row goes back on the report stream)."""
        self.runner.gate.sync(*policy_state)
        parts = None
        if target is not None and target.node_id == ray.get_runtime_context().get_node_id():
            async with self.opening:
                parts = self.parts.get(target)
                if parts is None:
                    parts = await asyncio.to_thread(WorkerParts, target, self.writer)
                    self.parts[target] = parts
        for earlier in self.sessions.values():
            earlier.close()
        self.sessions = {
            session: WorkerSession(self.runner.run_admitted, parts, histograms=self.histograms)
        }
        return parts is not None

    def take(self, session: str, episodes: bytes, policy_state: tuple[int, bool]) -> bool:
        """Play episodes in ``session``: a pickled pair of a list of ``(seq, spec, write)``
        and the seqs among them the engine has counted (the engine pickles them itself, see
        ``EngineActor._send``). False when this process never opened the session (the
        worker restarted: the engine opens a new one, sends again)."""
        found = self.sessions.get(session)
        if found is None:
            return False
        self.runner.gate.sync(*policy_state)
        found.take(*pickle.loads(episodes))
        return True

    async def reports(self, session: str) -> AsyncIterator[WorkerReport]:
        """A Ray streaming generator: the session's reports, for as long as it lasts."""
        found = self.sessions.get(session)
        if found is None:
            return
        try:
            async for report in found.reports():
                yield report
        finally:
            if self.sessions.get(session) is found:
                found.close()
                del self.sessions[session]

    async def flush(self) -> int:
        """Write every row this worker buffers to its parts now; returns rows written."""
        counts = await asyncio.gather(*(parts.flush() for parts in self.parts.values()))
        return sum(counts)

    async def pause(self, mode: PauseMode) -> int:
        """Hold this worker's new model calls (see ``policy_gate``); returns calls in flight."""
        return await self.runner.gate.pause(mode)

    async def settle(self, timeout_s: float) -> bool:
        """Whether none of this worker's model calls is in flight within ``timeout_s``."""
        return await self.runner.gate.settle(timeout_s)

    def resume(self, version: int) -> None:
        self.runner.gate.resume(version)

    def stopped_calls(self) -> list[dict[str, Any]]:
        """This worker's calls a pause stopped, with what they kept (``policy_gate``)."""
        return self.runner.gate.stopped_calls()

    def policy_calls(self) -> dict[str, Any]:
        """This worker's gate: version, paused, calls in flight, held, aborted, stale restarts."""
        return self.runner.gate.snapshot()

    def ready(self) -> str:
        return self.runner.name
