"""The engine actor's training-loop interface: ``generate``, ``pause``, ``resume``,
``update_weights`` and ``stats``, which a trainer calls on the actor found by name.

A mixin of ``EngineActor``, so Ray exposes these as the actor's methods with no forwarding
layer. Across calls the engine keeps per task only its next free sample index, as digests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rayrollout.data.config import PauseMode, RunConfig
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Task
from rayrollout.data.task_digests import NextSamples
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.engine.groups import GenerateResult, SamplingCounts, generate_groups
from rayrollout.engine.stats import RunStats
from rayrollout.engine.weights import WeightSync
from rayrollout.figures import EngineStats, PolicyCalls, PolicyState

__all__ = ["TrainingLoopAPI"]

_POLICY_CALL_FIGURES = (
    "in_flight",
    "calls",
    "held",
    "aborted",
    "stale_restarts",
    "interrupted",
    "kept_tokens",
    "discarded_tokens",
)


class TrainingLoopAPI:
    """What a trainer calls on the engine actor: GRPO groups and weight updates."""

    # Supplied by the engine actor (``actor.EngineActor``).
    config: RunConfig
    workers: list[Any]
    weights: WeightSync
    run_stats: RunStats
    folder: RunFolder
    # Dynamic sampling counts over every generate() call.
    sampling: SamplingCounts
    # generate(write=True): the next free sample index per task id, so (task_id,
    # sample_index) stays unique on disk across training steps (read from disk once).
    next_sample: NextSamples | None

    async def _run_specs(self, specs: list[EpisodeSpec], write: bool) -> list[dict[str, Any]]:
        raise NotImplementedError  # the engine actor's: episodes through its queue

    def _output_figures(self) -> dict[str, Any]:
        raise NotImplementedError  # the engine actor's: queue and writer figures

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
        taken = await self._samples_on_disk() if keep else None
        first = {t.task_id: taken.get(t.task_id, 0) for t in parsed} if taken is not None else {}

        async def run(specs: list[EpisodeSpec]) -> list[dict[str, Any]]:
            if taken is not None:
                for spec in specs:
                    taken.raise_to(spec.task.task_id, spec.sample_index + 1)
            return await self._run_specs(specs, keep)

        result, episodes = await generate_groups(parsed, n, run, dynamic, batch_size, extra, first)
        self.sampling.add(result, episodes)
        return result

    async def pause(self, mode: PauseMode | None = None) -> dict[str, Any]:
        """Hold every new model call; calls in flight per ``mode`` (default: config's
        ``training.pause_mode``): 'wait', 'abort_and_retry', 'continue' or 'interrupt'."""
        return await self.weights.pause(mode)

    async def resume(self) -> dict[str, Any]:
        """Let model calls go out again, under the current policy version."""
        return await self.weights.resume()

    async def stopped_calls(self) -> list[dict[str, Any]]:
        """The model calls a pause ('interrupt', or 'continue' on vLLM in token-ids mode)
        stopped and that wait for ``resume()``: per call its episode id, prompt ids and the
        completion ids, logprobs and token versions kept so far."""
        answers = await asyncio.gather(
            *(worker.stopped_calls.remote() for worker in self.workers), return_exceptions=True
        )
        return [call for answer in answers if isinstance(answer, list) for call in answer]

    async def update_weights(
        self, path: str | None = None, version: int | None = None
    ) -> dict[str, Any]:
        """Load a checkpoint folder (absolute path, safetensors) into every policy replica
        and move to ``version`` (default: the current one + 1); pauses around it unless
        already paused. Without ``path`` only the version moves (scripted policy, or a
        server the trainer updated itself)."""
        return await self.weights.update_weights(path, version)

    async def stats(self) -> EngineStats:
        """Episodes done and in flight, throughput, reward, errors, per environment; the
        policy version and calls held or aborted; dynamic sampling counts."""
        snapshot = self.stats_snapshot()
        answers = await asyncio.gather(
            *(worker.policy_calls.remote() for worker in self.workers), return_exceptions=True
        )
        calls = {key: 0 for key in _POLICY_CALL_FIGURES}
        for answer in answers:
            if isinstance(answer, dict):  # a restarting worker answers an exception: skipped
                for key in _POLICY_CALL_FIGURES:
                    calls[key] += answer[key]
        snapshot.policy_calls = PolicyCalls(**calls)
        return snapshot

    def stats_snapshot(self) -> EngineStats:
        """``stats()`` without asking the workers (no awaits)."""
        return EngineStats(
            **self.run_stats.summary(),
            **self._output_figures(),
            policy=PolicyState(**self.weights.snapshot()),
            dynamic_sampling=self.sampling.model_copy(),
        )

    async def _samples_on_disk(self) -> NextSamples:
        """The next free sample index per task id in the output folder; the folder is read
        once (``RunFolder.next_samples``), then the engine counts what its writing
        generate() calls start."""
        if self.next_sample is None:
            self.next_sample = await asyncio.to_thread(self.folder.next_samples)
        return self.next_sample
