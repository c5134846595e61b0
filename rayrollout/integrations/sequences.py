"""One trajectory as one token sequence, the shape every trainer trains on.

Turns that extend each other lay end to end: the first prompt, then per turn the environment
tokens (mask 0) and the sampled completion (mask 1, its logprobs and the weight version of
each token), as the engine recorded them, never re-tokenized. A failed or unchainable
episode is flagged, its mask all 0. Tokens a constraint forced (``tool_choice: required``,
a grammar) are masked 0 too unless ``mask_forced=False``: the model chose nothing there, and
its own logprob differs from the sampled 0.0.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rayrollout.client.models import TrajectoryRow
from rayrollout.integrations.errors import TooManyFailuresError

__all__ = [
    "ENVIRONMENT_VERSION",
    "Sequence",
    "TooManyFailuresError",
    "check_failures",
    "flatten",
    "group_rows",
]

POLICY = "policy"
ENVIRONMENT_VERSION = -1
"""The version ``Sequence.token_versions`` gives a token the environment wrote (mask 0)."""


@dataclass
class Sequence:
    """One episode as a trainer sees it."""

    task_id: str
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]  # 1 on tokens the policy sampled, 0 on environment tokens
    logprobs: list[float]  # aligned with response_ids; 0.0 on environment tokens
    reward: float
    status: str
    error: str | None
    policy_versions: list[int] = field(default_factory=list)  # one per policy turn
    forced: list[bool] = field(default_factory=list)  # aligned: True on forced tokens
    model_logprobs: list[float] = field(default_factory=list)  # aligned: the model's own
    token_versions: list[int] = field(default_factory=list)  # aligned: -1 on environment ones
    step_rewards: list[float | None] = field(default_factory=list)  # one per policy turn
    stop_reason: str = "stop"
    row: TrajectoryRow | None = None

    @property
    def failed(self) -> bool:
        return self.status != "ok" or self.error is not None

    @property
    def num_turns(self) -> int:
        return len(self.policy_versions)

    @property
    def oldest_version(self) -> int | None:
        return min(self.policy_versions) if self.policy_versions else None


def flatten(row: TrajectoryRow, mask_forced: bool = True) -> Sequence:
    """The row's policy turns as one sequence (see the module's docstring); with
    ``mask_forced`` the tokens a constraint forced are left out of the mask."""
    turns = [t for t in row.turns if t.speaker == POLICY]
    prompt: list[int] = []
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    forced: list[bool] = []
    model_logprobs: list[float] = []
    versions: list[int] = []
    problem = row.error if row.status != "ok" else None
    for index, turn in enumerate(turns):
        if len(turn.logprobs) != len(turn.completion_token_ids) and problem is None:
            problem = (
                f"turn {index}: {len(turn.completion_token_ids)} completion ids but "
                f"{len(turn.logprobs)} logprobs (serve the policy with logprobs and token ids)"
            )
        if index == 0:
            prompt = list(turn.prompt_token_ids)
        else:
            seen = prompt + response
            if not turn.extends_previous or turn.prompt_token_ids[: len(seen)] != seen:
                if problem is None:
                    problem = (
                        f"turn {index}: its prompt ids do not extend the previous turn's prompt "
                        "and completion, so the episode is not one token sequence"
                    )
                break
            environment = turn.prompt_token_ids[len(seen) :]
            response += environment
            mask += [0] * len(environment)
            logprobs += [0.0] * len(environment)
            forced += [False] * len(environment)
            model_logprobs += [0.0] * len(environment)
            versions += [ENVIRONMENT_VERSION] * len(environment)
        n = len(turn.completion_token_ids)
        response += turn.completion_token_ids
        own = list(turn.logprobs)
        logprobs += own + [0.0] * (n - len(own))
        # Unknown (an older row, an image prompt under a constraint): the sampled ones.
        model = list(turn.model_logprobs) if len(turn.model_logprobs) == n else own
        model_logprobs += model + [0.0] * (n - len(model))
        marks = list(turn.forced) if len(turn.forced) == n else [False] * n
        forced += marks
        mask += [0 if mask_forced and mark else 1 for mark in marks]
        made_by = list(turn.token_versions)[:n]
        versions += made_by + [turn.policy_version] * (n - len(made_by))
    if not turns and problem is None:
        problem = "the episode has no policy turn"
    status = row.status if row.status != "ok" or problem is None else "not_one_sequence"
    finish = turns[-1].finish_reason if turns else None
    return Sequence(
        task_id=row.task_id,
        sample_index=row.sample_index,
        prompt_ids=prompt,
        response_ids=response[: len(mask)],
        mask=[0] * len(mask) if problem else mask,
        logprobs=logprobs[: len(mask)],
        forced=forced[: len(mask)],
        model_logprobs=model_logprobs[: len(mask)],
        token_versions=versions[: len(mask)],
        reward=row.reward,
        status=status,
        error=problem,
        policy_versions=[t.policy_version for t in turns],
        step_rewards=[getattr(t, "step_reward", None) for t in turns],
        stop_reason="error" if problem else (finish or "stop"),
        row=row,
    )


def group_rows(rows: list[TrajectoryRow]) -> dict[str, list[TrajectoryRow]]:
    """Rows by task id, each group in sample order (what a GRPO group is)."""
    groups: dict[str, list[TrajectoryRow]] = defaultdict(list)
    for row in rows:
        groups[row.task_id].append(row)
    return {task: sorted(group, key=lambda r: r.sample_index) for task, group in groups.items()}


def task_row(
    task_id: str, prompt: Any, environment: str | None, fields: dict[str, Any] | None
) -> dict[str, Any]:
    """A rayrollout task row from what a trainer's batch carries."""
    row: dict[str, Any] = {**(fields or {}), "task_id": task_id, "prompt": prompt}
    if environment:
        row["environment"] = environment
    return row


def check_failures(sequences: list[Sequence], max_failed_fraction: float) -> list[Sequence]:
    """The batch's failed sequences; raises ``TooManyFailuresError``, naming the first, when
    they are more than ``max_failed_fraction`` of it."""
    failures = [s for s in sequences if s.failed]
    if len(failures) > max_failed_fraction * len(sequences):
        first = failures[0]
        raise TooManyFailuresError(
            f"{len(failures)} of {len(sequences)} episodes failed (more than "
            f"{max_failed_fraction:.0%}); first: task {first.task_id!r} sample "
            f"{first.sample_index}: {first.status}: {first.error}"
        )
    return failures
