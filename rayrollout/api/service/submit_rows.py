"""A submit's task rows, checked whole before anything runs.

Every row is parsed as a task file row (the same ``parse_task_row`` as ``collect``), task
ids must be unique within the submit, and the environment and agent a row names must exist.
A bad row is named by its index in ``tasks`` and its field; the submit is refused with 400
and nothing starts, or, with ``skip_invalid``, the rest runs and the answer lists it.
"""

from __future__ import annotations

from typing import Any

from rayrollout.api.preflight import check_agent, environment_known
from rayrollout.api.service.engine_link import HttpError
from rayrollout.client.models import RowError
from rayrollout.data.config import RunConfig
from rayrollout.data.schema import Task
from rayrollout.data.tasks import InvalidTaskError, UniqueTaskIds, parse_task_row
from rayrollout.errors import InputError

__all__ = ["RowChecker"]


class RowChecker:
    """Checks submitted rows against the run's config; each name is looked up once."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.known_names: dict[tuple[str, str], str | None] = {}  # (kind, name) -> problem

    def tasks(
        self, rows: list[dict[str, Any]], skip_invalid: bool
    ) -> tuple[list[Task], list[RowError]]:
        """The rows as tasks and the rows refused.

        Raises:
            HttpError: 400 naming the first bad row and field (all of them in ``errors``),
                unless ``skip_invalid``.
        """
        tasks, rejected = self.parse(rows)
        if rejected and not skip_invalid:
            first = rejected[0]
            more = f"; {len(rejected) - 1} more bad rows in 'errors'" if len(rejected) > 1 else ""
            raise HttpError(
                400,
                f"{_where(first)}: {first.message}{more}. Nothing was started",
                errors=[r.model_dump() for r in rejected],
            )
        return tasks, rejected

    def parse(self, rows: list[dict[str, Any]]) -> tuple[list[Task], list[RowError]]:
        """The rows as tasks, and the rows refused (index, field, message)."""
        tasks: list[Task] = []
        rejected: list[RowError] = []
        unique = UniqueTaskIds()
        for index, row in enumerate(rows):
            raw_id = row.get("task_id") if isinstance(row, dict) else None
            try:
                task = parse_task_row(
                    row, default_environment=self.config.environment, source="tasks", line=index
                )
                unique.check(task, "tasks", index)
                field, problem = self.names_problem(task)
                if problem is not None:
                    raise InvalidTaskError("tasks", index, field, problem)
            except InvalidTaskError as exc:
                task_id = raw_id if isinstance(raw_id, str | int) else None
                rejected.append(
                    RowError(
                        row=index,
                        task_id=None if task_id is None else str(task_id),
                        field=exc.field,
                        message=exc.message.replace(" line ", " row "),
                    )
                )
                continue
            tasks.append(task)
        return tasks, rejected

    def names_problem(self, task: Task) -> tuple[str, str | None]:
        """Whether the task's environment and agent exist: the field and the problem."""
        for kind, name in (("environment", task.environment), ("agent", task.agent)):
            if name is None:
                continue
            if (kind, name) not in self.known_names:
                self.known_names[(kind, name)] = self._name_problem(kind, name)
            problem = self.known_names[(kind, name)]
            if problem is not None:
                return kind, problem
        return "", None

    def _name_problem(self, kind: str, name: str) -> str | None:
        if kind == "environment":
            known = environment_known(name, self.config)
            return None if known else f"unknown environment {name!r}"
        try:
            check_agent(name, self.config, "the row")
        except InputError as exc:
            return str(exc)
        return None


def _where(error: RowError) -> str:
    named = f" (task_id {error.task_id!r})" if error.task_id is not None else ""
    field = f", field '{error.field}'" if error.field else ""
    return f"tasks[{error.row}]{named}{field}"
