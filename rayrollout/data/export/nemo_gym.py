"""NeMo Gym rollout files (0.7.0): the rows of the three files its rollout collection writes.

JSONL only, the three files its rollout collection (``nemo_gym/rollout_collection.py``)
leaves beside ``OUT``, named as ``nemo_gym/path_utils.py`` names them. ``OUT`` holds one
``BaseVerifyResponse`` (``nemo_gym/base_resources_server.py``: ``responses_create_params`` +
``response`` + ``reward``, extra verifier fields beside them) per verified episode;
``response`` is a Responses-API response (``NeMoGymResponse``) whose ``output`` holds
``message``, ``function_call`` and ``function_call_output`` items. ``<stem>_failures.jsonl``
holds the episodes that failed, one row each with ``_ng_failure_class`` and no ``reward`` (an
infrastructure failure is not a score of zero), so NeMo Gym's aggregation leaves them out of
the score. ``<stem>_materialized_inputs.jsonl`` holds every episode's input row, which ``gym
eval profile`` and reverification pair with the rollouts. Every row of the three carries the
keys the collector stamps on its records: ``_ng_task_index``, ``_ng_rollout_index``,
``agent_ref`` (where the task had one) and ``_ng_environment_server``; rollout and failure
rows also ``_ng_result_type``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rayrollout.data.export.base import ExportError
from rayrollout.data.export.trl import split_prompt
from rayrollout.data.responses import episode_response, responses_create_params, seed_body
from rayrollout.data.schema import Task, Trajectory

__all__ = [
    "VERIFIED",
    "nemo_gym_failure_row",
    "nemo_gym_files",
    "nemo_gym_input_row",
    "nemo_gym_row",
]

# Verified episodes: NeMo Gym's main rollouts file holds these; failures go to a sidecar.
VERIFIED = frozenset({"ok", "max_turns", "truncated"})
# A failed episode's ``_ng_failure_class``, from NeMo Gym's shared vocabulary
# (``nemo_gym/failure_kinds.py``): the episode ran and broke (a tool, the policy, the
# verifier), or ran out of time. Neither holds a reward, as NeMo Gym's own failure rows.
_FAILURE_CLASSES = {"error": "agent_run_error", "timeout": "agent_timeout"}
# 0.7.0 stamps each record with the implementation that produced it. Ours is what its
# ``legacy_agent`` relays: an episode the agent owned, answered by the resources server's
# /verify (a ``BaseVerifyResponse``), which is the shape reverification reads.
_NG_RESULT_TYPE = "legacy_agent"


def nemo_gym_files(out: str | Path) -> dict[str, Path]:
    """The files of a NeMo Gym rollout collection whose rollouts file is ``out``.

    Named as NeMo Gym's ``failures_path_for`` and ``materialized_path_for`` name them, so its
    tools (``gym eval profile``, ``aggregate``, reverification) find them from ``out`` alone.
    """
    out = Path(out)
    return {
        "rollouts": out,
        "failures": out.with_name(f"{out.stem}_failures.jsonl"),
        "inputs": out.with_name(f"{out.stem}_materialized_inputs.jsonl"),
    }


def nemo_gym_input_row(trajectory: Trajectory, task_index: int) -> dict[str, Any]:
    """The episode's materialized input row: the task row NeMo Gym would have dispatched.

    It is the body rayrollout sent to ``/verify`` less the response (a NeMo Gym row's own
    fields, else ``responses_create_params`` built from the prompt and tools plus the task's
    fields), so NeMo Gym's reverification, which posts this row plus the rollout's
    ``response``, asks the verifier what rayrollout asked it.
    """
    return {
        **seed_body(_task(trajectory)),
        "task_id": trajectory.task_id,
        **_stamps(trajectory, task_index, result=False),
    }


def nemo_gym_row(trajectory: Trajectory, task_index: int) -> dict[str, Any]:
    """One NeMo Gym rollout row of a verified episode, as ``ng_collect_rollouts`` writes them.

    A NeMo Gym task row's own ``responses_create_params`` is kept as it was (its verifiers
    read fields of it); other rows get one built from the prompt and the tools offered. The
    verifier's details and the task's fields sit beside ``reward``, as a resources server's
    verify answer puts them, so the row can be verified again.
    """
    task = _task(trajectory)
    fields = {k: v for k, v in trajectory.task_fields.items() if k != "responses_create_params"}
    row: dict[str, Any] = {**fields, **trajectory.verification}
    row.update(
        responses_create_params=responses_create_params(task),
        response=_response(trajectory, task),
        reward=trajectory.reward,
        task_id=trajectory.task_id,
        **_stamps(trajectory, task_index),
    )
    return row


def nemo_gym_failure_row(trajectory: Trajectory, task_index: int) -> dict[str, Any]:
    """One row of NeMo Gym's failures file for an episode that failed (``error``, ``timeout``).

    As NeMo Gym's own failure rows: the failure's class and message and no ``reward`` (a
    failure is not a verifier's zero; its aggregation counts one only when asked to), and
    what the episode produced before it failed as ``_ng_failure_partial_response``.
    """
    if trajectory.status not in _FAILURE_CLASSES:
        raise ExportError(
            f"task '{trajectory.task_id}' sample {trajectory.sample_index}: status "
            f"'{trajectory.status}' is not a failure ({', '.join(_FAILURE_CLASSES)})"
        )
    response = _response(trajectory, _task(trajectory))
    response["status"] = "failed"
    return {
        "task_id": trajectory.task_id,
        "_ng_failure_class": _FAILURE_CLASSES[trajectory.status],
        "_ng_failure_message": trajectory.error or f"episode ended with '{trajectory.status}'",
        "_ng_failure_partial_response": response,
        **_stamps(trajectory, task_index),
    }


def _task(trajectory: Trajectory) -> Task:
    """The task the episode played, rebuilt from its prompt, tools and fields."""
    prompt, _ = split_prompt(trajectory)
    try:
        return Task(
            task_id=trajectory.task_id,
            environment=trajectory.environment,
            prompt=prompt,
            tools=trajectory.tools or None,
            fields=trajectory.task_fields,
        )
    except ValidationError as exc:
        raise ExportError(
            f"task '{trajectory.task_id}' sample {trajectory.sample_index}: its prompt is not "
            f"a task prompt ({exc.errors()[0]['msg']})"
        ) from None


def _response(trajectory: Trajectory, task: Task) -> dict[str, Any]:
    """The episode as a Responses-API response, stable across exports of the same folder."""
    response = episode_response(task, trajectory.messages, trajectory.model)
    response["id"] = f"resp_{trajectory.task_id}_{trajectory.sample_index}"
    # Unix seconds as a float: the openai ``Response`` model that NeMoGymResponse extends
    # types it ``float``, so every response NeMo Gym dumps holds a float here.
    response["created_at"] = trajectory.created_at.timestamp()
    if trajectory.status == "truncated":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    metrics = trajectory.metrics
    response["usage"] = {
        "input_tokens": metrics.tokens_in,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": metrics.tokens_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": metrics.tokens_in + metrics.tokens_out,
    }
    return response


def _stamps(trajectory: Trajectory, task_index: int, result: bool = True) -> dict[str, Any]:
    """The keys NeMo Gym's collector puts on the rows it writes, for this episode.

    ``agent_ref`` is the task row's own, where it had one (a NeMo Gym row). The environment
    that ran the episode stands as the environment server: NeMo Gym's reports group rows by
    it (``rollout_run_key``), so rows without an ``agent_ref`` still group by environment.
    ``_ng_result_type`` describes a result, so input rows go without it, as NeMo Gym's do.
    """
    stamps: dict[str, Any] = {}
    agent_ref = trajectory.task_fields.get("agent_ref")
    if isinstance(agent_ref, dict):
        stamps["agent_ref"] = agent_ref
    stamps.update(
        _ng_task_index=task_index,
        _ng_rollout_index=trajectory.sample_index,
        _ng_environment_server=trajectory.environment,
    )
    if result:
        stamps["_ng_result_type"] = _NG_RESULT_TYPE
    return stamps
