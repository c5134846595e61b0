"""NeMo Gym's agent-server call on the rollout service: ``POST /run``.

NeMo Gym's rollout collection (``ng_collect_rollouts``) and the trainers built on it post a
task row to an agent server's ``/run`` and read back the verify answer: the row's
``responses_create_params``, the episode as a Responses-API ``response``, ``reward``, and
the verifier's fields beside them. Here the episode is played by rayrollout's agents,
environments and policy, through the engine's queue like any batch, and the answer is the
row rayrollout's NeMo Gym export writes for it (``data.export.nemo_gym``) without the
collector's own ``_ng_`` stamps, which the collector adds. An episode that failed (status
``error`` or ``timeout``) answers 500 with NeMo Gym's failure fields: a failure is not a
score of zero.
"""

from __future__ import annotations

from typing import Any

import orjson

from rayrollout.api.service.core import HttpError, RolloutService, engine_error
from rayrollout.data.export.nemo_gym import VERIFIED, nemo_gym_failure_row, nemo_gym_row
from rayrollout.data.schema import Trajectory
from rayrollout.data.tasks import InvalidTaskError, parse_task_row
from rayrollout.engine.episode import EpisodeSpec

__all__ = ["run_nemo_gym"]


async def run_nemo_gym(service: RolloutService, body: Any) -> tuple[int, dict[str, Any]]:
    """Play one episode of the NeMo Gym row ``body``; NeMo Gym's verify answer for it."""
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a NeMo Gym task row (a JSON object)")
    config = service.config
    environment = config.service.nemo_gym_environment or config.environment
    try:
        task = parse_task_row(body, default_environment=environment, source="request")
    except InvalidTaskError as exc:
        where = f"field '{exc.field}': " if exc.field else ""
        raise HttpError(400, f"{where}{exc.message}", field=exc.field) from None
    field, problem = service.rows.names_problem(task)
    if problem is not None:
        raise HttpError(400, f"field '{field}': {problem}", field=field)
    write = config.training.write_trajectories
    index = 0
    rows: list[bytes] = []
    if write:
        index = (await service.call_engine("reserve_samples", {task.task_id: 1}))[task.task_id]
    engine = await service.link.current()
    try:
        async for ref in engine.stream.remote([EpisodeSpec(task, index)], write):
            rows += [row for _, _, row in await ref]
    except Exception as exc:
        service.link.lost(engine, exc)
        raise engine_error(exc) from None
    trajectory = Trajectory.from_row(orjson.loads(rows[0]))
    if trajectory.status in VERIFIED:
        return 200, _without_stamps(nemo_gym_row(trajectory, 0))
    failure = _without_stamps(nemo_gym_failure_row(trajectory, 0))
    return 500, {"detail": failure.get("_ng_failure_message"), **failure}


def _without_stamps(row: dict[str, Any]) -> dict[str, Any]:
    """The row less the keys NeMo Gym's collector stamps itself; failure keys stay."""
    return {k: v for k, v in row.items() if not k.startswith("_ng_") or k.startswith("_ng_failure")}
