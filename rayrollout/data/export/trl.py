"""TRL rows: SFT (``sft_row``) and DPO (``dpo_row``), and the prompt split every export uses.

The formats, as TRL defines them (``docs/source/dataset_formats.md``, "conversational"
language-modeling and preference types): ``messages``, or ``prompt`` + ``chosen`` +
``rejected``, lists of ``{role, content}`` messages, with ``tool_calls`` whose
``function.arguments`` is an object (the form TRL's docs and
``trl.chat_template_utils.supports_tool_calling`` use) and a ``tools`` column of function
schemas. The column is JSON text: ``SFTTrainer`` and ``DPOTrainer`` both ``json.loads`` a
string ``tools`` (``tokenize_fn`` in ``trl/trainer/sft_trainer.py`` and ``dpo_trainer.py``),
and text keeps Arrow from merging unrelated schemas into one struct full of nulls. In
Parquet, message lists are Arrow's canonical JSON extension type, which ``datasets``
(>= 4.7) reads as ``List(Json)``, like the same rows in JSONL: each message keeps exactly
its own keys (``writing``).

A row whose episode shows images takes TRL's vision form (``trl_vision``): placeholders in
the messages and an ``images`` column of the images in their order; text rows are as above.
"""

from __future__ import annotations

import json
from typing import Any

from rayrollout.data.convert import json_or_text
from rayrollout.data.export.base import ExportError
from rayrollout.data.export.trl_vision import has_images, vision_messages
from rayrollout.data.schema import Message, Trajectory

__all__ = ["chat_message", "dpo_row", "sft_row", "split_prompt", "tools_text"]


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
        call["function"]["arguments"] = json_or_text(call["function"]["arguments"], dict)
    return out


def sft_row(trajectory: Trajectory) -> dict[str, Any]:
    """One TRL conversational language-modeling row: the whole episode as ``messages``."""
    messages = [chat_message(m) for m in trajectory.messages]
    row: dict[str, Any] = {
        "messages": messages,
        "tools": tools_text(trajectory.tools),
        "task_id": trajectory.task_id,
        "sample_index": trajectory.sample_index,
        "reward": trajectory.reward,
    }
    if has_images(trajectory):
        row["messages"], row["images"] = vision_messages(
            trajectory, trajectory.messages, messages, "messages"
        )
    return row


def dpo_row(chosen: Trajectory, rejected: Trajectory) -> dict[str, Any]:
    """One TRL conversational preference row: the shared prompt and each episode's part.

    ``chosen`` and ``rejected`` hold everything after the prompt (assistant turns and the
    tool messages between them), so multi-turn tool use is what is compared.
    """
    prompt, chosen_part = split_prompt(chosen)
    _, rejected_part = split_prompt(rejected)
    row: dict[str, Any] = {
        "prompt": [chat_message(m) for m in prompt],
        "chosen": [chat_message(m) for m in chosen_part],
        "rejected": [chat_message(m) for m in rejected_part],
        "tools": tools_text(chosen.tools),
        "task_id": chosen.task_id,
        "chosen_sample_index": chosen.sample_index,
        "rejected_sample_index": rejected.sample_index,
        "chosen_reward": chosen.reward,
        "rejected_reward": rejected.reward,
    }
    if has_images(chosen) or has_images(rejected):
        # TRL fills only the prompt's placeholders; an image after it is refused by name.
        row["prompt"], row["images"] = vision_messages(chosen, prompt, row["prompt"], "prompt")
        for side, episode, part in (
            ("chosen", chosen, chosen_part),
            ("rejected", rejected, rejected_part),
        ):
            row[side], _ = vision_messages(episode, part, row[side], side, images_allowed=False)
    return row


def tools_text(tools: list[dict[str, Any]]) -> str | None:
    """The ``tools`` column: the function schemas as JSON text (see the module's docstring)."""
    return json.dumps(tools, ensure_ascii=False) if tools else None
