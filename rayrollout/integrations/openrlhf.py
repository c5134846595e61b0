"""OpenRLHF's agent executor, played by rayrollout: this file is what OpenRLHF's
``--train.agent_func_path`` names.

OpenRLHF loads that file by path, builds its ``AgentExecutor`` with no arguments once per
vLLM actor (``RolloutRayActor``), and calls ``execute(prompt, label, sampling_params,
max_length, hf_tokenizer, llm_engine)`` once per sample. This executor does not generate with
``llm_engine`` (an object in OpenRLHF's own Ray, which rayrollout's agents cannot call): it
sends the task to rayrollout's rollout service and waits for the episode's row, so the policy
that plays is the engine's, not OpenRLHF's vLLM (OpenRLHF still builds its engines and
broadcasts its weights to them, not to rayrollout). The engine's weights move by checkpoint
path (``client.update_weights``), and every turn's policy version is reported. The calls that
arrive together go to the service as one batch (``RayrolloutExecutor``).

The answer is what OpenRLHF's ``SamplesGenerator._process_response_into_experience`` reads:
``observation_tokens`` the whole sequence (the first prompt, then every environment and model
token, the engine's ids unchanged), ``action_ranges`` the ``[start, end)`` spans of the tokens
the policy sampled, ``rollout_log_probs`` one per token of ``observation_tokens`` (the policy's
on its spans, 0.0 elsewhere), ``reward`` and ``scores`` the episode's reward. ``extra_logs``
holds numbers only (OpenRLHF makes each a tensor): ``rayrollout/failed``,
``rayrollout/num_turns``, ``rayrollout/oldest_policy_version``. A failed episode keeps its
place with no action span (nothing to train on), ``rayrollout/failed`` 1, and its status and
error under ``rayrollout_status`` and ``rayrollout_error``; more than ``max_failed_fraction``
of the episodes an executor has played failing raises.

The task comes from OpenRLHF's ``label`` (``--data.label_key``): a rayrollout task row as a
dict or a JSON string, with its ``task_id``; without a ``prompt`` of its own, OpenRLHF's prompt
is sent. The service is named by ``RAYROLLOUT_URL`` and ``RAYROLLOUT_TOKEN`` or
``RAYROLLOUT_TOKEN_FILE`` in the vLLM actors' environment.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from typing import Any

from rayrollout.client import AsyncRolloutClient
from rayrollout.errors import InputError, RayrolloutError
from rayrollout.integrations.sequences import (
    ENVIRONMENT_VERSION,
    Sequence,
    TooManyFailuresError,
    flatten,
    group_rows,
)

try:
    from openrlhf.utils.agent import AgentExecutorBase
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rayrollout.integrations.openrlhf needs OpenRLHF: pip install openrlhf==0.11.2; where "
        "its flash-attn and deepspeed do not build (no CUDA): pip install --no-deps "
        "openrlhf==0.11.2, then pip install torch==2.13.0 pylatexenc numpy transformers==5.15.0 "
        "aiohttp 'ray[default]==2.55.0'"
    ) from exc

__all__ = ["AgentExecutor", "RayrolloutExecutor", "TooManyFailuresError", "action_output"]

# OpenRLHF's (vLLM's) sampling attributes -> rayrollout's task-row ``sampling`` keys.
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed"}
MIN_EPISODES = 8  # the failed share is judged once an executor has played this many
RECENT = 1024  # episodes ``recent`` keeps, for a look at the rows behind the outputs


def task_from(prompt: Any, label: Any) -> dict[str, Any]:
    """The rayrollout task row an OpenRLHF sample stands for (see the module's docstring)."""
    row = label
    if isinstance(label, str):
        try:
            row = json.loads(label)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"label {label[:80]!r} is not a rayrollout task row: put the row (with its "
                "task_id) in the dataset column --data.label_key names, as JSON"
            ) from exc
    if not isinstance(row, dict) or not row.get("task_id"):
        raise InputError(f"label {str(label)[:80]!r} has no task_id: it must be a task row")
    return {"prompt": prompt, **row}


def action_output(sequence: Sequence) -> dict[str, Any]:
    """OpenRLHF's executor output for one flattened episode."""
    tokens = sequence.prompt_ids + sequence.response_ids
    offset = len(sequence.prompt_ids)
    ranges: list[tuple[int, int]] = []
    for i, bit in enumerate(sequence.mask):
        if not bit:
            continue
        if ranges and ranges[-1][1] == offset + i:
            ranges[-1] = (ranges[-1][0], offset + i + 1)
        else:
            ranges.append((offset + i, offset + i + 1))
    versions = sequence.policy_versions
    return {
        "observation_tokens": tokens,
        "action_ranges": ranges,
        "rollout_log_probs": [0.0] * offset + list(sequence.logprobs),
        "truncated": sequence.stop_reason == "length",
        "reward": float(sequence.reward),
        "scores": float(sequence.reward),
        "extra_logs": {
            "rayrollout/failed": float(sequence.failed),
            "rayrollout/num_turns": float(sequence.num_turns),
            "rayrollout/oldest_policy_version": float(min(versions, default=0)),
        },
        "rayrollout_status": sequence.status,
        "rayrollout_error": sequence.error,
        "rayrollout_policy_versions": versions,
        # Aligned with observation_tokens, as rollout_log_probs: -1 outside the actions.
        "rayrollout_token_versions": [ENVIRONMENT_VERSION] * offset + sequence.token_versions,
        "task_id": sequence.task_id,
        "sample_index": sequence.sample_index,
    }


class RayrolloutExecutor(AgentExecutorBase):
    """An OpenRLHF executor whose episodes rayrollout plays.

    OpenRLHF calls ``execute`` once per sample, ``n`` calls at a time for each prompt. The
    calls that arrive within ``window_s`` of each other go to the service as one batch (a
    task's samples as one group of ``n``), so an actor holds one open batch, not one per
    episode (the service bounds its open batches).

    Args:
        client: The rollout service's async client (default: from ``RAYROLLOUT_URL`` and
            ``RAYROLLOUT_TOKEN`` or ``RAYROLLOUT_TOKEN_FILE``).
        max_failed_fraction: Raise ``TooManyFailuresError`` when more of the episodes played
            so far failed (judged from the eighth on).
        window_s: How long the first call of a batch waits for others to join it.
        mask_forced: Leave the tokens a constraint forced out of the action mask (False
            keeps them).
    """

    def __init__(
        self,
        client: AsyncRolloutClient | None = None,
        max_failed_fraction: float = 0.5,
        window_s: float = 0.05,
        mask_forced: bool = True,
    ) -> None:
        self.mask_forced = mask_forced
        if client is None:
            url = os.environ.get("RAYROLLOUT_URL")
            if not url:
                raise InputError(
                    "RAYROLLOUT_URL is not set in OpenRLHF's vLLM actors: export it (and "
                    "RAYROLLOUT_TOKEN or RAYROLLOUT_TOKEN_FILE) in the Ray job's environment"
                )
            client = AsyncRolloutClient(
                url,
                os.environ.get("RAYROLLOUT_TOKEN"),
                token_file=os.environ.get("RAYROLLOUT_TOKEN_FILE"),
            )
        self.client = client
        self.max_failed_fraction = max_failed_fraction
        self.window_s = window_s
        self.played = 0
        self.failed = 0
        self.recent: deque[tuple[str, Sequence]] = deque(maxlen=RECENT)  # (batch id, episode)
        self.waiting: dict[str, tuple[dict[str, Any], list[asyncio.Future[Any]]]] = {}
        self.flushing: asyncio.Task[None] | None = None
        self.running: set[asyncio.Task[None]] = set()  # flushes under way, kept referenced

    async def execute(
        self,
        prompt: Any,
        label: Any,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> dict[str, Any]:
        """Play one episode of the task ``label`` names; ``llm_engine`` is not used."""
        if images:
            raise InputError("rayrollout's OpenRLHF executor takes no images: put them in the task")
        task = task_from(prompt, label)
        sampling = {
            key: getattr(sampling_params, name)
            for name, key in SAMPLING_KEYS.items()
            if getattr(sampling_params, name, None) is not None
        }
        if sampling:
            task["sampling"] = {**sampling, **task.get("sampling", {})}
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        key = json.dumps(task, sort_keys=True, default=str)
        self.waiting.setdefault(key, (task, []))[1].append(future)
        if self.flushing is None:
            self.flushing = asyncio.create_task(self.flush())
            self.running.add(self.flushing)
            self.flushing.add_done_callback(self.running.discard)
        batch_id, sequence = await future
        self.played += 1
        self.failed += sequence.failed
        if self.played >= MIN_EPISODES and self.failed > self.max_failed_fraction * self.played:
            raise TooManyFailuresError(
                f"{self.failed} of {self.played} episodes failed (more than "
                f"{self.max_failed_fraction:.0%}); last: task {sequence.task_id!r}: "
                f"{sequence.status}: {sequence.error}"
            )
        answer = {"prompt": prompt, "label": label, "images": None, **action_output(sequence)}
        return {**answer, "rayrollout_batch_id": batch_id}

    async def flush(self) -> None:
        """After the window, submit what waits: one batch per samples count (a batch has one
        ``n``) and per repeated task id, each row answered to its caller in sample order."""
        await asyncio.sleep(self.window_s)
        waiting, self.waiting, self.flushing = self.waiting, {}, None
        batches: list[list[tuple[dict[str, Any], list[asyncio.Future[Any]]]]] = []
        for task, futures in waiting.values():
            for batch in batches:
                n = len(batch[0][1])
                if n == len(futures) and all(t["task_id"] != task["task_id"] for t, _ in batch):
                    batch.append((task, futures))
                    break
            else:
                batches.append([(task, futures)])
        await asyncio.gather(*(self.play(batch) for batch in batches))

    async def play(self, batch: list[tuple[dict[str, Any], list[asyncio.Future[Any]]]]) -> None:
        try:
            status = await self.client.submit([t for t, _ in batch], n=len(batch[0][1]))
            groups = group_rows(await self.client.wait(status.batch_id))
        except Exception as exc:  # noqa: BLE001 - every caller of the batch gets it
            for _, futures in batch:
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            return
        for task, futures in batch:
            rows = groups.get(task["task_id"], [])
            for index, future in enumerate(futures):
                if future.done():
                    continue
                if index >= len(rows):
                    future.set_exception(
                        RayrolloutError(
                            f"batch {status.batch_id} answered no row for task "
                            f"{task['task_id']!r} sample {index}"
                        )
                    )
                    continue
                sequence = flatten(rows[index], self.mask_forced)
                self.recent.append((status.batch_id, sequence))
                future.set_result((status.batch_id, sequence))


class AgentExecutor(RayrolloutExecutor):
    """The class OpenRLHF's ``--train.agent_func_path`` loader looks for (built with no
    arguments: the service comes from the environment)."""
