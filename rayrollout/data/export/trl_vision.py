"""TRL's vision form of a conversation: ``{"type": "image"}`` placeholders in the messages,
and the images themselves, in the placeholders' order, in an ``images`` column.

That is the form TRL 1.16's vision data takes (``trl.data_utils.prepare_multimodal_messages``
fills each unfilled placeholder with the next image; ``DataCollatorForVisionLanguageModeling``
and ``DataCollatorForVisionPreference`` call it per row). Two rules of that function shape
what is written here:

- A user message whose content is a string gets placeholders for *all* the row's images put
  in front of it, if no message before it did. So in a row with images every message's
  content is a list of parts (text parts and placeholders), never a string.
- Tool messages are skipped: a placeholder in a tool result is neither counted nor filled,
  so an image a tool returned has no place in this form. Such a row is refused by name
  (dropping the picture would train the model on answers to an image it never saw).

An image given as an ``http(s)`` URL is refused too: the form holds the image, and nothing
here fetches URLs. The row holds each image as its data URL; ``writing`` stores the bytes
in Parquet as a ``datasets`` ``Image`` list.
"""

from __future__ import annotations

from typing import Any

from rayrollout.data.export.base import ExportError
from rayrollout.data.images import is_data_url
from rayrollout.data.schema import Message, Trajectory

__all__ = ["has_images", "vision_messages"]


def has_images(trajectory: Trajectory) -> bool:
    """Whether any message of the episode shows an image."""
    return any(m.images for m in trajectory.messages)


def vision_messages(
    trajectory: Trajectory,
    messages: list[Message],
    chats: list[dict[str, Any]],
    field: str,
    *,
    images_allowed: bool = True,
) -> tuple[list[dict[str, Any]], list[str]]:
    """``chats`` (the chat form of ``messages``, some of ``trajectory``'s) in TRL's vision
    form, and the data URLs of their images in placeholder order.

    ``field`` names the row's column in errors; ``images_allowed=False`` refuses any image
    (a DPO completion: TRL fills only the prompt's placeholders).
    """
    out: list[dict[str, Any]] = []
    urls: list[str] = []
    for j, (chat, message) in enumerate(zip(chats, messages, strict=True)):
        if message.images:
            _check(trajectory, message, f"{field}[{j}]", images_allowed)
            urls += [p.url or "" for p in message.images]
            content: Any = [
                {"type": "text", "text": p.text} if p.type == "text" else {"type": "image"}
                for p in message.parts or []
            ]
        elif isinstance(chat.get("content"), str):
            content = [{"type": "text", "text": chat["content"]}]
        else:
            out.append(chat)  # an assistant's tool calls with no text
            continue
        out.append({**chat, "content": content})
    return out, urls


def _check(trajectory: Trajectory, message: Message, field: str, images_allowed: bool) -> None:
    where = f"task '{trajectory.task_id}' sample {trajectory.sample_index}, field '{field}'"
    if message.role == "tool":
        raise ExportError(
            f"{where}: a tool result shows images, which TRL's vision data cannot hold "
            "(prepare_multimodal_messages fills no placeholder in a tool message)"
        )
    if not images_allowed:
        raise ExportError(
            f"{where}: shows images after the prompt; TRL's vision preference data fills "
            "only the prompt's image placeholders"
        )
    for part in message.images:
        if not is_data_url(part.url or ""):
            raise ExportError(
                f"{where}: image {part.url!r} is a URL; TRL's vision data holds the image "
                "itself, and the export fetches nothing"
            )
