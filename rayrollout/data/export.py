"""Exports: a run's output folder as training data for SFT, DPO, NeMo Gym and verl.

Each format is one small function from trajectories to a row (``sft_row``, ``dpo_row``,
``nemo_gym_row``, ``verl_row``); ``export_run`` streams the folder's part files through one
of them into a ``.jsonl`` or ``.parquet`` file. Rows are read part by part and batch by batch,
never the whole folder at once, and without the ``turns`` column (per-token ids and
logprobs: most of a row's bytes, and no export needs them). DPO pairs and verl's per-task
rows need every sample of a task first: a first pass reads only ``task_id``,
``sample_index``, ``reward`` and ``status`` and keeps a few numbers per task; a second pass
converts only the rows it picked. The four formats share that reader and the two passes,
which is why they live in one module (over 700 lines, mostly the formats' own docs below).

The formats, as their projects define them:

* **SFT / DPO** (TRL ``docs/source/dataset_formats.md``, "conversational" language-modeling
  and preference types): ``messages``, or ``prompt`` + ``chosen`` + ``rejected``, lists of
  ``{role, content}`` messages, with ``tool_calls`` whose ``function.arguments`` is an object
  (the form TRL's docs and ``trl.chat_template_utils.supports_tool_calling`` use) and a
  ``tools`` column of function schemas. The column is JSON text: ``SFTTrainer`` and
  ``DPOTrainer`` both ``json.loads`` a string ``tools`` (``tokenize_fn`` in
  ``trl/trainer/sft_trainer.py`` and ``dpo_trainer.py``), and text keeps Arrow from merging
  unrelated schemas into one struct full of nulls. In Parquet, message lists are Arrow's
  canonical JSON extension type, which ``datasets`` (>= 4.7) reads as ``List(Json)``, like
  the same rows in JSONL: each message keeps exactly its own keys.
* **NeMo Gym rollouts** (0.7.0): JSONL only, the three files its rollout collection
  (``nemo_gym/rollout_collection.py``) leaves beside ``OUT``, named as
  ``nemo_gym/path_utils.py`` names them. ``OUT`` holds one ``BaseVerifyResponse``
  (``nemo_gym/base_resources_server.py``: ``responses_create_params`` + ``response`` +
  ``reward``, extra verifier fields beside them) per verified episode; ``response`` is a
  Responses-API response (``NeMoGymResponse``) whose ``output`` holds ``message``,
  ``function_call`` and ``function_call_output`` items. ``<stem>_failures.jsonl`` holds the
  episodes that failed, one row each with ``_ng_failure_class`` and no ``reward`` (an
  infrastructure failure is not a score of zero), so NeMo Gym's aggregation leaves them out
  of the score. ``<stem>_materialized_inputs.jsonl`` holds every episode's input row, which
  ``gym eval profile`` and reverification pair with the rollouts. Every row of the three
  carries the keys the collector stamps on its records: ``_ng_task_index``,
  ``_ng_rollout_index``, ``agent_ref`` (where the task had one) and
  ``_ng_environment_server``; rollout and failure rows also ``_ng_result_type``.
* **verl** (``docs/preparation/prepare_data.rst``): one row per task with ``data_source``,
  ``prompt`` (chat messages), ``ability``, ``reward_model`` ``{"style": "rule",
  "ground_truth": ...}`` and ``extra_info``: prompts for verl to roll out itself.

The module is longer than most here because each format carries the notes on where its
shape comes from; the reading and writing around them is shared.

Example:
    >>> from rayrollout.data.export import export_run
    >>> export_run("sft", "rollouts/run1", "sft.jsonl", min_reward=1.0)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from rayrollout.data.schema import Message, Task, Trajectory
from rayrollout.environment.nemo_gym.client import (
    episode_response,
    responses_create_params,
    seed_body,
)

__all__ = [
    "KINDS",
    "ExportError",
    "ExportSummary",
    "chat_message",
    "dpo_row",
    "export_run",
    "nemo_gym_failure_row",
    "nemo_gym_files",
    "nemo_gym_input_row",
    "nemo_gym_row",
    "sft_row",
    "split_prompt",
    "verl_row",
]

KINDS = ("sft", "dpo", "nemo-gym", "verl")
SUFFIXES = (".jsonl", ".parquet")
_SKIPPED_COLUMNS = frozenset({"turns"})
_KEY_COLUMNS = frozenset({"task_id", "sample_index", "reward", "status"})
_BATCH = 256
# Verified episodes: NeMo Gym's main rollouts file holds these; failures go to a sidecar.
_VERIFIED = frozenset({"ok", "max_turns", "truncated"})
# A failed episode's ``_ng_failure_class``, from NeMo Gym's shared vocabulary
# (``nemo_gym/failure_kinds.py``): the episode ran and broke (a tool, the policy, the
# verifier), or ran out of time. Neither holds a reward, as NeMo Gym's own failure rows.
_FAILURE_CLASSES = {"error": "agent_run_error", "timeout": "agent_timeout"}
# 0.7.0 stamps each record with the implementation that produced it. Ours is what its
# ``legacy_agent`` relays: an episode the agent owned, answered by the resources server's
# /verify (a ``BaseVerifyResponse``), which is the shape reverification reads.
_NG_RESULT_TYPE = "legacy_agent"
# Task fields that hold the reference answer, in the order they are looked for.
_ANSWER_FIELDS = ("expected_answer", "ground_truth", "reference_answer", "answer")
# Rewards are floats: 0.7 - 0.2 is 0.49999999999999994, which a 0.5 gap should still take.
_GAP_TOLERANCE = 1e-9


class ExportError(ValueError):
    """The input cannot be exported: a missing folder, no rows, a bad row, a bad option."""


@dataclass
class ExportSummary:
    """What an export read and wrote (the row sources count into it as they go).

    ``rows_written`` counts ``out``'s rows; ``nemo-gym`` also writes the files in ``files``
    beside it, and ``failures_written`` counts the failed episodes in its failures file.
    """

    kind: str
    out: Path
    rows_read: int = 0
    rows_written: int = 0
    tasks: int = 0
    failures_written: int = 0
    files: list[Path] = field(default_factory=list)


# Conversions: one trajectory (or a pair) to one row.


def split_prompt(trajectory: Trajectory) -> tuple[list[Message], list[Message]]:
    """The prompt messages and the messages the episode added after them.

    Each model call appends exactly one assistant message (``episode.py``), so the episode's
    part starts at the assistant message that is ``metrics.turns``-th from the end; counting
    from the end keeps the assistant messages of a few-shot prompt in the prompt.
    """
    generated = max(trajectory.metrics.turns, len(trajectory.turns))
    assistant = [i for i, m in enumerate(trajectory.messages) if m.role == "assistant"]
    if generated > len(assistant):
        raise ExportError(
            f"task '{trajectory.task_id}' sample {trajectory.sample_index}, field "
            f"'metrics.turns': {generated} model calls, but 'messages' holds only "
            f"{len(assistant)} assistant message(s)"
        )
    start = assistant[-generated] if generated else len(trajectory.messages)
    return trajectory.messages[:start], trajectory.messages[start:]


def chat_message(message: Message) -> dict[str, Any]:
    """A message as TRL and Hugging Face chat templates read it: tool-call arguments as objects.

    Trajectories keep arguments as the JSON text the model wrote (OpenAI's wire form); chat
    templates render them with ``tojson``, which would quote that text a second time. Text
    that is not a JSON object (a malformed call the model made) stays text.
    """
    out = message.to_openai()
    for call in out.get("tool_calls") or []:
        call["function"]["arguments"] = _arguments(call["function"]["arguments"])
    return out


def sft_row(trajectory: Trajectory) -> dict[str, Any]:
    """One TRL conversational language-modeling row: the whole episode as ``messages``."""
    return {
        "messages": [chat_message(m) for m in trajectory.messages],
        "tools": _tools_text(trajectory.tools),
        "task_id": trajectory.task_id,
        "sample_index": trajectory.sample_index,
        "reward": trajectory.reward,
    }


def dpo_row(chosen: Trajectory, rejected: Trajectory) -> dict[str, Any]:
    """One TRL conversational preference row: the shared prompt and each episode's part.

    ``chosen`` and ``rejected`` hold everything after the prompt (assistant turns and the
    tool messages between them), so multi-turn tool use is what is compared.
    """
    prompt, chosen_part = split_prompt(chosen)
    _, rejected_part = split_prompt(rejected)
    return {
        "prompt": [chat_message(m) for m in prompt],
        "chosen": [chat_message(m) for m in chosen_part],
        "rejected": [chat_message(m) for m in rejected_part],
        "tools": _tools_text(chosen.tools),
        "task_id": chosen.task_id,
        "chosen_sample_index": chosen.sample_index,
        "rejected_sample_index": rejected.sample_index,
        "chosen_reward": chosen.reward,
        "rejected_reward": rejected.reward,
    }


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


def verl_row(
    trajectory: Trajectory, index: int, samples: int = 1, mean_reward: float | None = None
) -> dict[str, Any]:
    """One verl RL row for the trajectory's task: its prompt and how to score answers to it.

    ``ground_truth`` is the task's reference answer (``expected_answer``, ``ground_truth``,
    ``reference_answer`` or ``answer``) as text, else all its verifier fields as JSON text,
    for a custom verl reward function; ``extra_info`` adds how the task fared here.
    """
    prompt, _ = split_prompt(trajectory)
    fields = {
        k: v
        for k, v in trajectory.task_fields.items()
        if k not in ("responses_create_params", "agent_ref")
    }
    return {
        "data_source": trajectory.environment,
        "prompt": [{"role": m.role, "content": m.content or ""} for m in prompt],
        "ability": trajectory.environment,
        "reward_model": {"style": "rule", "ground_truth": _ground_truth(fields)},
        "extra_info": {
            "index": index,
            "task_id": trajectory.task_id,
            "environment": trajectory.environment,
            "samples": samples,
            "mean_reward": trajectory.reward if mean_reward is None else mean_reward,
            "tools": _tools_text(trajectory.tools) or "",
            "fields": json.dumps(fields, ensure_ascii=False, default=str),
        },
    }


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def _tools_text(tools: list[dict[str, Any]]) -> str | None:
    return json.dumps(tools, ensure_ascii=False) if tools else None


def _ground_truth(fields: dict[str, Any]) -> str:
    for name in _ANSWER_FIELDS:
        if name in fields:
            value = fields[name]
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return json.dumps(fields, ensure_ascii=False, default=str) if fields else ""


# Reading the output folder, part by part.


def part_files(directory: str | Path) -> list[Path]:
    """The part files of a run's output folder, Parquet first, each kind in name order."""
    directory = Path(directory)
    if not directory.exists():
        raise ExportError(f"input folder not found: {directory}")
    if not directory.is_dir():
        raise ExportError(f"{directory} is a file; IN is the output folder of `rayrollout collect`")
    parts = sorted(directory.glob("part-*.parquet")) + sorted(directory.glob("part-*.jsonl"))
    if not parts:
        raise ExportError(
            f"no part files (part-*.parquet or part-*.jsonl) in {directory}: is it the "
            "output folder of `rayrollout collect`?"
        )
    return parts


def _rows(parts: list[Path], columns: frozenset[str] | None = None) -> Iterator[tuple[str, dict]]:
    """(where, row) for every row; ``columns`` limits what is read, else all but ``turns``."""

    def wanted(name: str) -> bool:
        return name in columns if columns is not None else name not in _SKIPPED_COLUMNS

    for path in parts:
        if path.suffix == ".parquet":
            yield from _parquet_rows(path, wanted)
            continue
        with path.open(encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                where = f"{path.name} line {number}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ExportError(f"{where}: malformed JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise ExportError(f"{where}: a row must be a JSON object")
                yield where, {k: v for k, v in row.items() if wanted(k)}


def _parquet_rows(path: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, dict]]:
    try:
        file = pq.ParquetFile(path)
        names = [n for n in file.schema_arrow.names if wanted(n)]
        index = 0
        for batch in file.iter_batches(batch_size=_BATCH, columns=names):
            for row in batch.to_pylist():
                yield f"{path.name} row {index}", row
                index += 1
    except (pa.ArrowException, OSError) as exc:
        raise ExportError(f"{path.name}: cannot read it as Parquet: {exc}") from None


def _trajectory(where: str, row: dict[str, Any]) -> Trajectory:
    try:
        return Trajectory.from_row(row)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first["loc"]) or "?"
        raise ExportError(f"{where}, field '{name}': {first['msg']}") from None
    except ValueError as exc:  # a JSON column whose text is not JSON
        raise ExportError(f"{where}: a JSON column is not valid JSON ({exc})") from None


def _number(where: str, row: dict[str, Any], name: str) -> float:
    if row.get(name) is None:
        raise ExportError(f"{where}, field '{name}': missing")
    try:
        return float(row[name])
    except (TypeError, ValueError):
        raise ExportError(f"{where}, field '{name}': not a number: {row[name]!r}") from None


@dataclass
class _Group:
    """What the first pass keeps of one task: counts, and its best and worst 'ok' samples."""

    samples: int = 0
    reward_sum: float = 0.0
    best: tuple[float, int] | None = None  # (reward, sample_index)
    worst: tuple[float, int] | None = None


def _groups(parts: list[Path], counts: ExportSummary) -> dict[str, _Group]:
    groups: dict[str, _Group] = {}
    for where, row in _rows(parts, _KEY_COLUMNS):
        counts.rows_read += 1
        if row.get("task_id") is None:
            raise ExportError(f"{where}, field 'task_id': missing")
        task_id = str(row["task_id"])
        reward, index = _number(where, row, "reward"), int(_number(where, row, "sample_index"))
        group = groups.setdefault(task_id, _Group())
        group.samples += 1
        group.reward_sum += reward
        if row.get("status") != "ok":
            continue
        # Ties go to the lowest sample index, so the same folder always gives the same pairs.
        if group.best is None or (reward, -index) > (group.best[0], -group.best[1]):
            group.best = (reward, index)
        if group.worst is None or (reward, index) < group.worst:
            group.worst = (reward, index)
    counts.tasks = len(groups)
    return groups


# Row sources, one per export kind.


def _sft_rows(parts: list[Path], counts: ExportSummary, min_reward: float) -> Iterator[dict]:
    for where, row in _rows(parts):
        counts.rows_read += 1
        if row.get("status") == "ok" and _number(where, row, "reward") >= min_reward:
            yield sft_row(_trajectory(where, row))


def _dpo_rows(parts: list[Path], counts: ExportSummary, min_gap: float) -> Iterator[dict]:
    picked: dict[tuple[str, int], str] = {}
    for task_id, group in _groups(parts, counts).items():
        best, worst = group.best, group.worst
        if not best or not worst or best[1] == worst[1]:
            continue
        if best[0] - worst[0] >= min_gap - _GAP_TOLERANCE:
            picked[(task_id, best[1])] = "chosen"
            picked[(task_id, worst[1])] = "rejected"
    # A pair's two rows may sit in different parts: hold the first half until the second.
    halves: dict[str, dict[str, Trajectory]] = {}
    for where, row in _rows(parts):
        side = picked.get((str(row.get("task_id")), int(row.get("sample_index") or 0)))
        if side is None:
            continue
        trajectory = _trajectory(where, row)
        pair = halves.setdefault(trajectory.task_id, {})
        pair[side] = trajectory
        if len(pair) == 2:
            del halves[trajectory.task_id]
            yield dpo_row(pair["chosen"], pair["rejected"])


def _nemo_gym_rows(parts: list[Path], counts: ExportSummary) -> Iterator[tuple[str, dict]]:
    """(file, row) for the three NeMo Gym files: every episode's input row, then its
    rollout row if it was verified, else its failure row.

    Tasks are numbered in the order they first appear. NeMo Gym keys rows by (task index,
    rollout index) and its profiler rejects a key seen twice, so a second row for the same
    task and sample (two runs' parts in one folder) is an error here; the keys are the only
    per-row state kept.
    """
    task_index: dict[str, int] = {}
    seen: dict[str, set[int]] = {}
    for where, row in _rows(parts):
        counts.rows_read += 1
        trajectory = _trajectory(where, row)
        samples = seen.setdefault(trajectory.task_id, set())
        if trajectory.sample_index in samples:
            raise ExportError(
                f"{where}: task '{trajectory.task_id}' sample {trajectory.sample_index} is "
                "already in an earlier row; NeMo Gym needs one row per task and sample (is the "
                "folder two runs' parts?)"
            )
        samples.add(trajectory.sample_index)
        index = task_index.setdefault(trajectory.task_id, len(task_index))
        counts.tasks = len(task_index)
        yield "inputs", nemo_gym_input_row(trajectory, index)
        if trajectory.status in _VERIFIED:
            yield "rollouts", nemo_gym_row(trajectory, index)
        else:
            yield "failures", nemo_gym_failure_row(trajectory, index)


def _verl_rows(parts: list[Path], counts: ExportSummary) -> Iterator[dict]:
    groups = _groups(parts, counts)
    seen: set[str] = set()
    for where, row in _rows(parts):
        task_id = str(row.get("task_id"))
        if task_id in seen:
            continue
        seen.add(task_id)
        group = groups[task_id]
        yield verl_row(
            _trajectory(where, row), len(seen) - 1, group.samples, group.reward_sum / group.samples
        )


# Writing: JSONL lines, or Parquet row groups with a fixed schema per kind (a schema
# inferred per batch could change between batches, e.g. 'tools' all null in one).

_TEXT, _INT, _FLOAT = pa.string(), pa.int64(), pa.float64()
_MESSAGES = pa.list_(pa.json_())  # Arrow's canonical JSON type: datasets reads List(Json)
_SCHEMAS: dict[str, pa.Schema] = {
    "sft": pa.schema(
        [
            ("messages", _MESSAGES),
            ("tools", _TEXT),
            ("task_id", _TEXT),
            ("sample_index", _INT),
            ("reward", _FLOAT),
        ]
    ),
    "dpo": pa.schema(
        [
            ("prompt", _MESSAGES),
            ("chosen", _MESSAGES),
            ("rejected", _MESSAGES),
            ("tools", _TEXT),
            ("task_id", _TEXT),
            ("chosen_sample_index", _INT),
            ("rejected_sample_index", _INT),
            ("chosen_reward", _FLOAT),
            ("rejected_reward", _FLOAT),
        ]
    ),
    "verl": pa.schema(
        [
            ("data_source", _TEXT),
            ("prompt", pa.list_(pa.struct([("role", _TEXT), ("content", _TEXT)]))),
            ("ability", _TEXT),
            ("reward_model", pa.struct([("style", _TEXT), ("ground_truth", _TEXT)])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", _INT),
                        ("task_id", _TEXT),
                        ("environment", _TEXT),
                        ("samples", _INT),
                        ("mean_reward", _FLOAT),
                        ("tools", _TEXT),
                        ("fields", _TEXT),
                    ]
                ),
            ),
        ]
    ),
}


def _write_routed(rows: Iterator[tuple[str, dict]], paths: dict[str, Path]) -> dict[str, int]:
    """Write each (file, row) as a JSONL line of ``paths[file]``; return the rows per file.

    Every file is created, empty or not: NeMo Gym's collection leaves an empty failures
    file when nothing failed, and its tools read the files by name.
    """
    written = dict.fromkeys(paths, 0)
    files: dict[str, TextIO] = {}
    try:
        for name, path in paths.items():
            files[name] = path.open("w", encoding="utf-8")
        for name, row in rows:
            files[name].write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            written[name] += 1
    finally:
        for file in files.values():
            file.close()
    return written


def _write(rows: Iterator[dict], path: Path, suffix: str, schema: pa.Schema | None) -> int:
    """Write rows to ``path`` as ``suffix`` says; return how many."""
    written = 0
    if suffix == ".jsonl" or schema is None:
        with path.open("w", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
                written += 1
        return written
    # Message lists are built as lists of JSON text, then cast to the JSON extension type.
    text_lists = [f.name for f in schema if f.type == _MESSAGES]
    storage = pa.schema(
        [f.with_type(pa.list_(_TEXT)) if f.name in text_lists else f for f in schema]
    )
    batch: list[dict] = []
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for row in rows:
            for name in text_lists:
                row[name] = [json.dumps(m, ensure_ascii=False) for m in row[name]]
            batch.append(row)
            if len(batch) >= _BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=storage).cast(schema))
                written, batch = written + len(batch), []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=storage).cast(schema))
            written += len(batch)
    return written


# The entry point.


def export_run(
    kind: str,
    source: str | Path,
    out: str | Path,
    *,
    min_reward: float = 1.0,
    min_gap: float = 0.5,
) -> ExportSummary:
    """Export a run's output folder as ``kind`` rows to ``out`` (``.jsonl`` or ``.parquet``).

    Args:
        kind: ``sft``, ``dpo``, ``nemo-gym`` or ``verl``.
        source: The output folder of ``rayrollout collect`` (Parquet or JSONL parts).
        out: The file to write; written to a hidden temporary file and renamed into place,
            so a failed export leaves no partial file. ``nemo-gym`` also writes
            ``<stem>_failures.jsonl`` and ``<stem>_materialized_inputs.jsonl`` beside it
            (``nemo_gym_files``), the same way.
        min_reward: ``sft``: keep trajectories with status ``ok`` and at least this reward.
        min_gap: ``dpo``: pair a task's best and worst ``ok`` samples when their rewards
            differ by at least this much (one pair per task).

    Raises:
        ExportError: a bad option, a missing or empty folder, a bad row (named by file and
            line or row and field), or nothing to export.

    Example:
        >>> export_run("dpo", "rollouts/run1", "pairs.parquet", min_gap=0.5)  # doctest: +SKIP
    """
    out = Path(out)
    if kind not in KINDS:
        raise ExportError(f"unknown export {kind!r}; use one of {', '.join(KINDS)}")
    if out.suffix not in SUFFIXES:
        raise ExportError(f"OUT must end in .jsonl or .parquet, got {out.name!r}")
    if out.suffix == ".parquet" and kind not in _SCHEMAS:
        raise ExportError(
            f"{kind} rows are JSONL (NeMo Gym reads and writes rollouts as JSONL); "
            f"name OUT {out.with_suffix('.jsonl').name!r}"
        )
    if not 0.0 < min_gap <= 1.0:
        raise ExportError(f"--min-gap must be in (0, 1] (rewards are in [0, 1]), got {min_gap}")
    parts = part_files(source)
    counts = ExportSummary(kind=kind, out=out)
    targets = nemo_gym_files(out) if kind == "nemo-gym" else {"main": out}
    temporaries = {name: path.with_name(f".{path.name}.tmp") for name, path in targets.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "nemo-gym":
            written = _write_routed(_nemo_gym_rows(parts, counts), temporaries)
            counts.rows_written, counts.failures_written = written["rollouts"], written["failures"]
        else:
            rows = {
                "sft": lambda: _sft_rows(parts, counts, min_reward),
                "dpo": lambda: _dpo_rows(parts, counts, min_gap),
                "verl": lambda: _verl_rows(parts, counts),
            }[kind]()
            counts.rows_written = _write(rows, temporaries["main"], out.suffix, _SCHEMAS.get(kind))
        if counts.rows_written == 0:
            raise ExportError(_nothing_to_export(kind, Path(source), counts, min_reward, min_gap))
        # OUT last: where it exists, the files beside it are whole too.
        for name in sorted(targets, key=lambda name: targets[name] == out):
            os.replace(temporaries[name], targets[name])
    finally:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)
    counts.files = list(targets.values())
    return counts


def _nothing_to_export(
    kind: str, source: Path, counts: ExportSummary, min_reward: float, min_gap: float
) -> str:
    if counts.rows_read == 0:
        return f"the part files in {source} hold no rows"
    why = {
        "sft": f"has status 'ok' and reward >= {min_reward}; lower --min-reward",
        "nemo-gym": (
            f"was verified (status ok, max_turns or truncated); {counts.failures_written} "
            "failed (NeMo Gym fails a collection with no verified rollout too)"
        ),
    }
    if kind == "dpo":
        return (
            f"none of the {counts.tasks} task(s) in {source} has two 'ok' samples whose "
            f"rewards differ by >= {min_gap}; lower --min-gap, or collect more samples per "
            "task (--num-repeats)"
        )
    return f"none of the {counts.rows_read} trajectories in {source} {why[kind]}"
