"""NeMo Gym's agent-server call on the rollout service: ``POST /run``.

NeMo Gym's collectors post a task row and read back the verify answer; here the episode goes
through the engine's queue like any batch, and the answer is the row rayrollout's NeMo Gym
export writes. A failed episode answers 500 with NeMo Gym's failure fields, not a zero.
"""

from __future__ import annotations

from typing import Any

import orjson

from rayrollout.api.service.core import HttpError, RolloutService, engine_error
from rayrollout.data.export.nemo_gym import VERIFIED, nemo_gym_failure_row, nemo_gym_row
from rayrollout.data.schema import Trajectory
from rayrollout.data.tasks import InvalidTaskError, parse_task_row
from rayrollout.engine.episode_spec import EpisodeSpec

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
    if task.opening == "agent":  # this service is the agent server: nobody writes the prompt
        raise HttpError(
            400,
            "field 'responses_create_params.input': empty, and /run plays a row from its own "
            "prompt; a row whose prompt NeMo Gym's agent writes goes to that agent (or to "
            "`rayrollout collect` with the nemo_gym agent)",
            field="responses_create_params.input",
        )
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
