"""The model's own logprobs and the forced tokens of a turn; one job: constrained sampling.

A constraint (``tool_choice: required`` or a named tool, guided decoding, a grammar) masks
the logits before vLLM samples, and vLLM's logprobs, ``raw_logprobs`` included, are taken
after that mask: a token the constraint left alone reads 0.0 while the model gives it far
less. So under a constraint each turn records which tokens were forced (the constrained
distribution gave them probability 1: logprob exactly 0.0) and the model's own logprob of
every token, from one prefill of prompt + completion through ``/completions`` with
``prompt_logprobs`` (prompt tokens skip every sampling processor, the grammar's mask too).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from rayrollout.data.schema import Turn
from rayrollout.errors import PolicyBoundaryError

__all__ = [
    "ModelLogprobs",
    "completion_logprobs",
    "constraint_of",
    "forced_mask",
    "record_model_logprobs",
    "rescore_body",
]

ModelLogprobs = Literal["constrained", "all", "off"]
"""Which turns are rescored: those a constraint shaped (the default), every turn, none."""

# Request keys (top level or extra_body) that constrain what vLLM may sample.
_CONSTRAINT_KEYS = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "structural_tag",
)

Post = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class _RescoreError(PolicyBoundaryError, ValueError):
    """The rescoring answer does not hold one logprob per completion token (an unusable
    answer: the client retries the call, then fails it with a ``PolicyError``)."""


def constraint_of(
    tools: list[dict[str, Any]], tool_choice: Any, body: dict[str, Any]
) -> str | None:
    """What constrained a call, in a few words, or None: a required or named tool choice
    with tools offered, a ``response_format`` other than text, or guided decoding."""
    if tools and (tool_choice == "required" or isinstance(tool_choice, dict)):
        return f"tool_choice {tool_choice!r}" if tool_choice == "required" else "a named tool"
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return f"response_format {response_format.get('type')!r}"
    for key in _CONSTRAINT_KEYS:
        if body.get(key) is not None:
            return key
    return None


def forced_mask(logprobs: list[float]) -> list[bool]:
    """Under a constraint, which tokens it forced: their constrained logprob is exactly 0.0
    (every other token's probability under float32's resolution once masked)."""
    return [value == 0.0 for value in logprobs]


def rescore_body(model: str, turn: Turn) -> dict[str, Any]:
    """The ``/completions`` request whose ``prompt_logprobs`` are the model's own logprobs of
    ``turn``'s prompt + completion (one prefill; the one token it samples is dropped)."""
    return {
        "model": model,
        "prompt": list(turn.prompt_token_ids) + list(turn.completion_token_ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,  # the given token's own logprob at each position
    }


def completion_logprobs(answer: dict[str, Any], turn: Turn) -> list[float]:
    """The completion tokens' logprobs out of a rescoring answer's ``prompt_logprobs`` (one
    ``{token id: {"logprob": ...}}`` per prompt position, None at the first)."""
    choices = answer.get("choices") or []
    entries = (choices[0].get("prompt_logprobs") if choices else None) or answer.get(
        "prompt_logprobs"
    )
    ids = list(turn.prompt_token_ids) + list(turn.completion_token_ids)
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise _RescoreError(
            f"the rescoring answer holds {len(entries) if isinstance(entries, list) else 'no'} "
            f"prompt_logprobs for {len(ids)} tokens (serve vLLM, whose /completions takes "
            "prompt_logprobs)"
        )
    start = len(turn.prompt_token_ids)
    values = []
    for position in range(start, len(ids)):
        entry = entries[position] or {}
        found = entry.get(str(ids[position]), entry.get(ids[position]))
        if not isinstance(found, dict) or not isinstance(found.get("logprob"), int | float):
            raise _RescoreError(
                f"the rescoring answer has no logprob of token {ids[position]} at position "
                f"{position}"
            )
        values.append(float(found["logprob"]))
    return values


async def record_model_logprobs(
    turn: Turn, constraint: str | None, mode: ModelLogprobs, model: str, post: Post
) -> None:
    """Fill ``turn.forced`` and ``turn.model_logprobs`` (see the module's docstring).

    Unconstrained, the sampled logprobs are the model's own (vLLM's default ``logprobs_mode``
    is ``raw_logprobs``: before temperature and top-p) and are copied, unless ``mode`` is
    ``all``. A turn without ids and one logprob per id is left as it is, and so is the
    ``model_logprobs`` of a constrained turn whose prompt shows images.
    """
    ids = turn.completion_token_ids
    if not ids or len(turn.logprobs) != len(ids):
        return
    if constraint is not None:
        turn.forced = forced_mask(turn.logprobs)
    rescore = mode == "all" or (mode == "constrained" and constraint is not None)
    # A prompt with images (vLLM's token route) holds expanded placeholder ids, which
    # /completions cannot take without the images: not rescored.
    if rescore and turn.prompt_token_ids and turn._sent_prompt_ids is None:
        answer = await post("/completions", rescore_body(model, turn))
        turn.model_logprobs = completion_logprobs(answer, turn)
    elif constraint is None:
        turn.model_logprobs = list(turn.logprobs)
