"""One trajectory row as one token sequence (``rayrollout.integrations.sequences``): the
shape every trainer adapter answers, and the flags a broken episode carries instead of
training. Pure data: runs in rayrollout's own venv, no trainer needed."""

from __future__ import annotations

import importlib
import importlib.util
import re

import pytest

from rayrollout.client import TrajectoryRow
from rayrollout.integrations import flatten, group_rows


def row(turns: list[dict], **fields) -> TrajectoryRow:
    base = {"task_id": "t", "sample_index": 0, "group_id": "g", "environment": "e"}
    return TrajectoryRow.model_validate({**base, "turns": turns, **fields})


def turn(prompt, completion, version=0, extends=True, speaker="policy", **more):
    return {
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "logprobs": [-t / 10 for t in completion],
        "policy_version": version,
        "extends_previous": extends,
        "speaker": speaker,
        **more,
    }


def test_turns_chain_into_one_sequence_masked_on_environment_tokens():
    seq = flatten(
        row(
            [
                turn([1, 2], [3, 4], version=1, extends=False),
                turn([1, 2, 3, 4, 9, 9], [5], version=2, finish_reason="stop"),
            ],
            reward=0.5,
        )
    )
    assert seq.prompt_ids == [1, 2]
    assert seq.response_ids == [3, 4, 9, 9, 5]
    assert seq.mask == [1, 1, 0, 0, 1]
    assert seq.logprobs == [-0.3, -0.4, 0.0, 0.0, -0.5]
    assert (seq.reward, seq.failed, seq.policy_versions, seq.oldest_version) == (
        0.5,
        False,
        [1, 2],
        1,
    )
    assert seq.stop_reason == "stop"


def test_another_speakers_turns_are_environment_tokens_of_the_policy():
    seq = flatten(
        row(
            [
                turn([1], [2], extends=False),
                turn([7, 1, 2], [8], speaker="user", extends=False),
                turn([1, 2, 8, 6], [3]),
            ]
        )
    )
    assert (seq.response_ids, seq.mask) == ([2, 8, 6, 3], [1, 0, 0, 1])


def test_a_failed_episode_is_flagged_and_masked_not_given_reward_silently():
    seq = flatten(row([turn([1], [2], extends=False)], status="error", error="tool crashed"))
    assert seq.failed and seq.status == "error" and seq.error == "tool crashed"
    assert seq.mask == [0] and seq.stop_reason == "error"


def test_turns_that_do_not_extend_are_not_one_sequence():
    rewritten = flatten(row([turn([1], [2], extends=False), turn([1, 9, 2], [3])]))
    assert rewritten.failed and rewritten.status == "not_one_sequence"
    assert "do not extend" in (rewritten.error or "")
    assert set(rewritten.mask) <= {0}
    new_sequence = flatten(row([turn([1], [2], extends=False), turn([5], [3], extends=False)]))
    assert new_sequence.failed


def test_missing_logprobs_and_no_policy_turn_are_flagged():
    no_logprobs = flatten(row([{**turn([1], [2, 3], extends=False), "logprobs": []}]))
    assert no_logprobs.failed and "logprobs" in (no_logprobs.error or "")
    assert flatten(row([])).failed


def test_groups_are_by_task_in_sample_order():
    rows = [row([], task_id=t, sample_index=i) for t, i in [("a", 1), ("b", 0), ("a", 0)]]
    groups = group_rows(rows)
    assert [r.sample_index for r in groups["a"]] == [0, 1] and len(groups["b"]) == 1


@pytest.mark.parametrize(
    ("module", "needs"), [("skyrl", "pip install skyrl==0.4.0"), ("trl", "trl==1.16.0")]
)
def test_an_adapter_without_its_trainer_names_the_install(module, needs):
    trainer = {"skyrl": "skyrl", "trl": "transformers"}[module]
    if importlib.util.find_spec(trainer) is not None:
        pytest.skip(f"{trainer} is installed here")
    with pytest.raises(ImportError, match=re.escape(needs)):
        importlib.import_module(f"rayrollout.integrations.{module}")


def test_forced_tokens_are_masked_by_default_and_kept_when_asked():
    """A constrained turn's forced tokens leave the mask; the model's own logprobs ride
    along, 0.0 on environment tokens, the sampled ones where a turn recorded none."""
    rows = row(
        [
            turn(
                [1, 2],
                [3, 4, 5],
                extends=False,
                forced=[True, False, True],
                model_logprobs=[-7.0, -0.4, -3.0],
            ),
            turn([1, 2, 3, 4, 5, 9], [6]),  # unconstrained and from an older row: no fields
        ]
    )
    masked = flatten(rows)
    assert masked.response_ids == [3, 4, 5, 9, 6]
    assert masked.mask == [0, 1, 0, 0, 1]
    assert masked.forced == [True, False, True, False, False]
    assert masked.model_logprobs == [-7.0, -0.4, -3.0, 0.0, -0.6]
    assert masked.logprobs == [-0.3, -0.4, -0.5, 0.0, -0.6]
    kept = flatten(rows, mask_forced=False)
    assert kept.mask == [1, 1, 1, 0, 1] and kept.forced == masked.forced


def test_each_response_token_carries_the_version_that_made_it():
    """A turn a weight update cut keeps its per-token versions in the sequence, aligned with
    the response ids; environment tokens get -1; a row without them reads one per turn."""
    seq = flatten(
        row(
            [
                turn([1, 2], [3, 4, 5], version=1, extends=False, token_versions=[1, 1, 2]),
                turn([1, 2, 3, 4, 5, 9], [6, 7], version=2),
            ]
        )
    )
    assert seq.response_ids == [3, 4, 5, 9, 6, 7]
    assert seq.token_versions == [1, 1, 2, -1, 2, 2]
    assert len(seq.token_versions) == len(seq.mask) == len(seq.logprobs)
    assert (seq.policy_versions, seq.oldest_version) == ([1, 2], 1)
