"""Tasks, trajectories and their Arrow schema; one job: the schema derives from the models.

The data model: tasks in, trajectories out, and the one Arrow schema both file formats share.

Every output row, Parquet or JSONL, is ``Trajectory.to_row()``; every reader goes through
``Trajectory.from_row()``. The Arrow schema is derived from the pydantic models here, so a
field added to ``Trajectory`` reaches Parquet, JSONL and the readers in one edit, and Parquet
files of different runs concatenate.
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
import pyarrow as pa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rayrollout.data.images import (
    ImageError,
    canonical_data_url,
    data_url,
    decode_data_url,
    image_bytes,
    image_digest,
    image_size,
    is_data_url,
)

__all__ = [
    "RENAMED_COLUMNS",
    "ContentPart",
    "EpisodeMetrics",
    "FunctionCall",
    "Message",
    "SamplingParams",
    "Status",
    "StoredImage",
    "TimelineEvent",
    "Task",
    "ToolCall",
    "Trajectory",
    "Turn",
    "content_part",
    "inline_images",
    "renamed_columns",
    "stable_task_id",
    "trajectory_arrow_schema",
    "version_spans",
]

MAX_TOKENS = 10_000_000
"""The most ``max_tokens`` a task may ask for: above every model's context window."""
MAX_TEMPERATURE = 10.0
"""The highest sampling temperature a task may ask for (servers take 0 to 2 in practice)."""
MAX_ID_LENGTH = 1024
"""The longest ``task_id`` or environment name."""

Status = Literal["ok", "error", "timeout", "max_turns", "truncated"]


class JsonColumn:
    """Marks a free-form field stored as one JSON string column (its shape varies by row)."""


class ArrowType:
    """Overrides the Arrow type derived for a field (int32 token ids, float32 logprobs)."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Model):
    name: str = Field(description="Tool name the model asked for.")
    arguments: str = Field(description="Arguments as the JSON text the model produced.")


class ToolCall(_Model):
    id: str = Field(description="Call id that the tool message answers.")
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Model):
    """One part of a message that shows images: a text, or an image by URL.

    In memory and in JSONL rows an image part holds its ``url`` (a canonical data URL, or an
    http(s) URL kept as the task gave it). In Parquet rows a data image's bytes sit once in
    the row's ``images`` column, and the part holds their ``sha256`` instead of the URL.
    """

    type: Literal["text", "image"] = Field(description="'text' or 'image'.")
    text: str | None = Field(default=None, description="The text of a text part.")
    url: str | None = Field(
        default=None,
        description="An image part's URL: a data URL, or an http(s) URL (never fetched by "
        "rayrollout). Null in Parquet rows for a data image (see sha256).",
    )
    sha256: str | None = Field(
        default=None,
        description="In Parquet rows: the digest of a data image's bytes in the row's "
        "'images' column. Null in memory and in JSONL rows.",
    )
    detail: str | None = Field(
        default=None, description="The image detail asked of the model ('auto', 'low', 'high')."
    )

    @field_validator("url")
    @classmethod
    def _canonical(cls, url: str | None) -> str | None:
        # One form of each image's data URL, so a row rebuilt from its stored bytes gives
        # back the very message that was written.
        return canonical_data_url(url) if url is not None and is_data_url(url) else url

    @model_validator(mode="after")
    def _filled(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs 'text'")
        if self.type == "image" and not (self.url or self.sha256):
            raise ValueError("an image part needs a URL")
        return self

    def to_chat(self) -> dict[str, Any]:
        """The part as Chat Completions sends it (``text`` or ``image_url``)."""
        if self.type == "text":
            return {"type": "text", "text": self.text}
        image: dict[str, Any] = {"url": self.url}
        if self.detail is not None:
            image["detail"] = self.detail
        return {"type": "image_url", "image_url": image}

    def to_responses(self, role: str = "user") -> dict[str, Any]:
        """The part as a Responses-API content item (``input_text``/``output_text`` or
        ``input_image``)."""
        if self.type == "text":
            kind = "output_text" if role == "assistant" else "input_text"
            return {"type": kind, "text": self.text}
        return {"type": "input_image", "image_url": self.url, "detail": self.detail or "auto"}


_TEXT_KINDS = ("text", "input_text", "output_text")


def content_part(raw: Any) -> ContentPart:
    """A content part in any of the forms rayrollout reads, as ours: Chat ``text`` and
    ``image_url`` (``{"url", "detail"}`` or the URL alone), Responses ``input_text``,
    ``output_text`` and ``input_image``, an MCP ``{"type": "image", "data", "mimeType"}``
    item, or our own ``{"type": "text"|"image", ...}``. Raises ``ValueError`` otherwise."""
    if isinstance(raw, ContentPart):
        return raw
    if not isinstance(raw, dict):
        raise ValueError(f"a content part must be an object, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind in _TEXT_KINDS or (kind is None and "text" in raw):
        return ContentPart(type="text", text=raw.get("text"))
    if kind in ("image_url", "input_image"):
        image = raw.get("image_url")
        detail = raw.get("detail")
        if isinstance(image, dict):
            detail = image.get("detail", detail)
            image = image.get("url")
        if not isinstance(image, str) or not image:
            if raw.get("file_id") is not None:
                raise ValueError("an image given by file_id (an OpenAI upload) cannot be read")
            raise ValueError(f"a {kind} part needs its URL in 'image_url'")
        return ContentPart(type="image", url=image, detail=detail)
    if kind == "image":
        if "data" in raw:  # MCP image content
            found = image_bytes(raw)
            assert found is not None  # a dict of type image with data is one
            return ContentPart(type="image", url=data_url(found[1], found[0]))
        return ContentPart.model_validate(raw)
    raise ValueError(f"unsupported content part type {kind!r} (text and image parts only)")


class Message(_Model):
    """One chat message in OpenAI Chat Completions form.

    A message that shows images keeps its content as ``parts`` (text and image parts in
    order); ``content`` then holds its text parts joined by newlines, so code that reads
    text reads it there. Give the content as a list of parts (OpenAI's Chat or Responses
    forms) and both are filled; ``to_openai`` sends the parts.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = Field(
        default=None,
        description="Text; None for pure tool calls. For a message with parts: its text "
        "parts joined by newlines.",
    )
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="Tool calls of an assistant message."
    )
    tool_call_id: str | None = Field(default=None, description="Call answered by a tool message.")
    name: str | None = Field(default=None, description="Tool name of a tool message.")
    parts: list[ContentPart] | None = Field(
        default=None,
        description="The content as text and image parts, in order, when the message shows "
        "images; null for a text message.",
    )

    @model_validator(mode="before")
    @classmethod
    def _content_parts(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("content"), list):
            parts = []
            for j, raw in enumerate(data["content"]):
                try:
                    parts.append(content_part(raw))
                except (ValueError, ImageError) as exc:
                    raise ValueError(f"content[{j}]: {exc}") from None
            data = {**data, "parts": parts, "content": _joined_text(parts)}
        return data

    @property
    def images(self) -> list[ContentPart]:
        """The message's image parts, in order."""
        return [p for p in self.parts or [] if p.type == "image"]

    def to_openai(self) -> dict[str, Any]:
        """The message as the OpenAI client sends it, without empty fields; a message with
        parts sends them as its content (Chat Completions ``text`` and ``image_url``)."""
        message = self.model_dump(exclude_none=True, exclude={"parts"})
        if self.parts is not None:
            message["content"] = [part.to_chat() for part in self.parts]
        return message


def _joined_text(parts: list[ContentPart]) -> str | None:
    texts = [p.text for p in parts if p.type == "text" and p.text is not None]
    return "\n".join(texts) if texts else None


class SamplingParams(_Model):
    """Per-task sampling overrides; unset fields fall back to the run's policy config.

    Bounded here, so a row with ``max_tokens: 1e30`` or a negative temperature is refused
    at validation with the field named, not later by the policy server (blamed on it).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    temperature: float | None = Field(
        default=None, ge=0.0, le=MAX_TEMPERATURE, description="Sampling temperature, 0 to 10."
    )
    top_p: float | None = Field(
        default=None, gt=0.0, le=1.0, description="Nucleus sampling mass, above 0 up to 1."
    )
    max_tokens: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description=f"Tokens per model call, 1 to {MAX_TOKENS:,} (beyond any model's context).",
    )
    seed: int | None = Field(
        default=None,
        ge=-(2**63),
        le=2**63 - 1,
        description="Sampling seed (a 64-bit integer), where the server honours it.",
    )


def _no_control_characters(value: str, what: str) -> str:
    """``value`` unchanged, or a ValueError naming the first control character in it."""
    for index, char in enumerate(value):
        if unicodedata.category(char) == "Cc":
            raise ValueError(
                f"{what} must not contain control characters; found {char!r} at index {index}"
            )
    return value


class Task(_Model):
    """One prompt plus the environment that scores it; ``tasks.read_tasks`` builds them."""

    task_id: str = Field(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Stable id; derived from the row's content when not given. No control "
        f"characters, at most {MAX_ID_LENGTH} characters.",
    )
    environment: str = Field(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Registered environment name, e.g. 'weather'. No control characters.",
    )
    opening: Literal["prompt", "seed_session", "agent"] = Field(
        default="prompt",
        description="Where the episode's first observation comes from: the prompt, the "
        "NeMo Gym resources server's /seed_session answer (a NeMo Gym row with an empty "
        "'input' and the server's seed fields), or the task's agent, which writes it from "
        "the row's fields (a NeMo Gym row played by NeMo Gym's own agent or environment "
        "server: the 'nemo_gym' agent). The prompt may be empty unless it is 'prompt'.",
    )
    prompt: list[Message] = Field(description="Opening messages of the episode.")
    tools: list[dict[str, Any]] | None = Field(
        default=None,
        description="Chat Completions function tool schemas overriding the environment's own.",
    )
    fields: dict[str, Any] = Field(
        default_factory=dict,
        description="Verifier fields (expected answer, test cases) and any other extra columns.",
    )
    sampling: SamplingParams | None = Field(default=None, description="Sampling overrides.")
    agent: str | None = Field(
        default=None,
        max_length=MAX_ID_LENGTH,
        description="Registered agent that plays this task ('module:Class' works too); None: "
        "the run's --agent, else the environment's own default ('reset_step' for reset/step "
        "sources), else 'tool_loop'.",
    )

    @field_validator("task_id", "environment")
    @classmethod
    def _printable(cls, value: str, info: ValidationInfo) -> str:
        # A NUL or newline in an id breaks file names, logs and the policy server's headers
        # far from here; refused where the row is read, naming the field.
        return _no_control_characters(value, info.field_name or "id")

    @field_validator("agent")
    @classmethod
    def _printable_agent(cls, value: str | None) -> str | None:
        return None if value is None else _no_control_characters(value, "agent")

    @field_validator("prompt")
    @classmethod
    def _prompt_has_text(cls, prompt: list[Message], info: ValidationInfo) -> list[Message]:
        # A system prompt alone is a prompt: NeMo Gym tasks whose first user turn comes from
        # the environment (a Gymnasium /reset, a simulated customer) open with it only. A
        # seeded task's opening is the server's, an agent-written one its agent's, so its
        # prompt may hold nothing.
        if info.data.get("opening") in ("seed_session", "agent"):
            return prompt
        if not any(
            m.role in ("system", "user") and ((m.content or "").strip() or m.images) for m in prompt
        ):
            raise ValueError("the prompt holds no system or user message with text or an image")
        return prompt


class Turn(_Model):
    """One model call: what went in, what came out, and how long it took."""

    prompt_token_ids: Annotated[list[int], ArrowType(pa.list_(pa.int32()))] = Field(
        default_factory=list,
        description="Token ids of the rendered prompt, where the server gave them.",
    )
    completion_token_ids: Annotated[list[int], ArrowType(pa.list_(pa.int32()))] = Field(
        default_factory=list, description="Token ids the model generated."
    )
    logprobs: Annotated[list[float], ArrowType(pa.list_(pa.float32()))] = Field(
        default_factory=list, description="Logprob of each generated token."
    )
    finish_reason: str | None = None
    prompt_tokens: int = Field(default=0, description="Prompt tokens as the server counted them.")
    completion_tokens: int = Field(
        default=0, description="Generated tokens as counted by the server."
    )
    token_mismatch_index: int | None = Field(
        default=None,
        description="First index where prompt_token_ids does not extend the previous turn's "
        "prompt + completion ids; None when it does (or no ids were given).",
    )
    started_at: float = Field(default=0.0, description="Unix time the call started.")
    seconds: float = Field(default=0.0, description="Wall time of the call, retries included.")
    policy_version: int = Field(
        default=0,
        description="Policy weights version the call was sent under (rows written before "
        "the field existed read as 0).",
    )
    token_versions: Annotated[list[int], ArrowType(pa.list_(pa.int64()))] = Field(
        default_factory=list,
        description="Policy version of each generated token, aligned with "
        "completion_token_ids: a call a weight update cut ('interrupt', 'continue') has the "
        "old version up to the cut and the new one after (rows written before the field "
        "existed read as policy_version on every token).",
    )
    speaker: str = Field(
        default="policy",
        description="Who the model played in this call: 'policy' (trained on), or another role "
        "an agent gave it (e.g. 'user', a simulated user): a trainer keeps only 'policy' turns.",
    )
    extends_previous: bool = Field(
        default=False,
        description="This call's prompt is the previous call's (same speaker) prompt + its "
        "completion + new messages: one token sequence with it. False starts a new sequence "
        "(the first call, or an agent that trimmed or rewrote the history).",
    )
    sent_messages: list[Message] | None = Field(
        default=None,
        description="The messages this call sent, when they are not the first "
        "'prompt_message_count' messages of the trajectory (an agent that trimmed, summarized "
        "or played another role).",
    )
    prompt_message_count: int = Field(
        default=0,
        description="How many of the trajectory's messages this call sent, when it sent a "
        "prefix of them (sent_messages is None); 0 when sent_messages holds them.",
    )
    retries: int = Field(
        default=0,
        description="Failed tries before the answer this turn records (5xx, 429, timeouts, "
        "dropped connections, unusable answers), each sent again with backoff: a replica "
        "that died mid-call shows here, the turn served by another one.",
    )
    retry_errors: list[str] = Field(
        default_factory=list,
        description="What each failed try got, in order, briefly ('HTTP 500: ...', "
        "'ServerDisconnectedError', 'timeout').",
    )
    step_reward: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="The environment's reward for the action this call produced, where the "
        "episode steps an environment (reset/step environments: one step per policy call); "
        "None for a call that was no step. For credit assignment: the row's reward is their "
        "sum unless the environment says otherwise.",
    )
    forced: list[bool] = Field(
        default_factory=list,
        description="Per generated token: True where a constraint (tool_choice 'required', "
        "guided decoding, a grammar) forced it (its sampled logprob is exactly 0.0). Empty "
        "when no constraint shaped the call (or the row predates the field).",
    )
    model_logprobs: Annotated[list[float], ArrowType(pa.list_(pa.float32()))] = Field(
        default_factory=list,
        description="The model's own logprob of each generated token, unconstrained "
        "(logprobs is the sampling distribution's, 0.0 on forced tokens); empty where unknown.",
    )
    # In memory only: the prompt ids as sent when the server expanded them (a vision model's
    # image placeholders), which the next extending call continues from
    # (``prompt_token_ids`` holds the expanded ids, the sequence trained on).
    _sent_prompt_ids: list[int] | None = PrivateAttr(default=None)

    @field_validator("policy_version", "prompt_message_count", "retries", mode="before")
    @classmethod
    def _missing_int_is_zero(cls, value: Any) -> Any:
        # Parquet parts written before the field existed read back with nulls here.
        return 0 if value is None else value

    @model_validator(mode="after")
    def _versions_fill_from_policy_version(self) -> Turn:
        # Rows written before token_versions, and turns no gate stamped: one version.
        if not self.token_versions and self.completion_token_ids:
            self.token_versions = [self.policy_version] * len(self.completion_token_ids)
        return self

    @field_validator("speaker", mode="before")
    @classmethod
    def _missing_speaker_is_policy(cls, value: Any) -> Any:
        return "policy" if value is None else value

    @field_validator("extends_previous", mode="before")
    @classmethod
    def _missing_extends_is_false(cls, value: Any) -> Any:
        return False if value is None else value

    @field_validator("retry_errors", "token_versions", mode="before")
    @classmethod
    def _missing_list_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value

    @field_validator("forced", "model_logprobs", mode="before")
    @classmethod
    def _missing_token_list_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value


class TimelineEvent(_Model):
    """One step of an episode, so the episode can be replayed in time order."""

    kind: Literal["model", "tool", "step", "verify"] = Field(
        description="A model call, a tool call, a step of a reset/step environment (its "
        "'reset' or 'step'), or the verifier."
    )
    name: str = Field(default="", description="Tool name for tool steps; reset or step.")
    start_s: float = Field(description="Seconds from the episode's start.")
    seconds: float = Field(description="How long the step took.")
    ok: bool = Field(default=True, description="False for tool errors and failed steps.")


class EpisodeMetrics(_Model):
    started_at: float = Field(default=0.0, description="Unix time the episode started.")
    timeline: list[TimelineEvent] = Field(
        default_factory=list, description="Model calls, tool calls and verify, in order."
    )
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tools_used: list[str] = Field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    turns_across_updates: int = Field(
        default=0, description="Policy turns whose tokens two weight versions or more made."
    )
    seconds_model: float = 0.0
    seconds_tools: float = Field(
        default=0.0,
        description="Seconds in the environment: its tool calls, or the resets and steps of a "
        "reset/step environment.",
    )
    seconds_verify: float = 0.0
    seconds_total: float = 0.0
    seconds_queued: float = Field(
        default=0.0,
        description="Wall time from the engine queueing the episode to its start: waiting "
        "for a free slot (concurrency) and the worker call.",
    )
    token_mismatches: int = Field(
        default=0, description="Turns whose prompt ids did not extend the previous turn's ids."
    )
    token_mismatch_turn: int | None = Field(
        default=None, description="Index of the first such turn (None: no mismatch)."
    )
    token_mismatch_index: int | None = Field(
        default=None, description="First differing token index in that turn's prompt."
    )


class StoredImage(_Model):
    """One image of a row, stored once however many messages show it (Parquet rows)."""

    model_config = ConfigDict(extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")

    sha256: str = Field(description="SHA-256 hex digest of the bytes; parts refer to it.")
    mime: str = Field(description="MIME type, e.g. 'image/png'.")
    data: bytes = Field(description="The image file's bytes.")
    width: int | None = Field(default=None, description="Width in pixels (None: unread).")
    height: int | None = Field(default=None, description="Height in pixels (None: unread).")


class Trajectory(_Model):
    """One output row: a finished episode, scored or failed."""

    task_id: str
    sample_index: int = Field(description="Which of the task's samples this is (0-based).")
    group_id: str = Field(description="Samples of one task share it: a GRPO group.")
    environment: str
    worker: str = Field(
        default="",
        description="Name of the worker actor that played the episode, e.g. 'worker:0' "
        "(older rows name it in an 'agent' column, read back as this one).",
    )
    played_by: str = Field(
        default="",
        description="Registered name of the agent (the episode's loop) that played it, e.g. "
        "'tool_loop'; '' in rows written before agents were pluggable.",
    )
    model: str = Field(default="", description="Policy model name.")
    policy_version: int = Field(
        default=0,
        description="Policy weights version of its first model call (each turn records its own).",
    )
    messages: list[Message] = Field(default_factory=list)
    tools: Annotated[list[dict[str, Any]], JsonColumn] = Field(
        default_factory=list, description="Tool schemas offered to the model."
    )
    turns: list[Turn] = Field(default_factory=list)
    reward: float = Field(
        default=0.0,
        allow_inf_nan=False,
        description="The verifier's reward: any finite float (negative and above 1 too).",
    )
    verification: Annotated[dict[str, Any], JsonColumn] = Field(
        default_factory=dict, description="The verifier's details."
    )
    status: Status = "ok"
    error: str | None = None
    close_error: str | None = Field(
        default=None,
        description="Closing the environment session failed after the episode ended. The "
        "status and reward stand (the verifier had spoken); the server may hold the session's "
        "state until it expires.",
    )
    metrics: EpisodeMetrics = Field(default_factory=EpisodeMetrics)
    task_fields: Annotated[dict[str, Any], JsonColumn] = Field(
        default_factory=dict, description="The task's verifier fields, for exports and debugging."
    )
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    images: list[StoredImage] = Field(
        default_factory=list,
        description="Each data image the row's messages show, once (Parquet rows: image "
        "parts refer to it by sha256). Empty in JSONL rows, whose parts keep data URLs, and "
        "in a Trajectory read back, whose parts hold the URLs again.",
    )

    @field_validator("played_by", mode="before")
    @classmethod
    def _missing_agent_is_blank(cls, value: Any) -> Any:
        # Parquet parts written before the field existed read back with nulls here.
        return "" if value is None else value

    def to_row(self) -> dict[str, Any]:
        """The row written to Parquet and JSONL: JSON columns as text, the rest as is."""
        row = self.model_dump(mode="python")
        for name in _JSON_FIELDS:
            row[name] = _json_text(row[name])
        row["images"] = _store_images(row)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Trajectory:
        """Read back a row from Parquet (``to_pylist``) or a parsed JSONL line; a column of
        an older name (``RENAMED_COLUMNS``) reads as its new one."""
        data = renamed_columns(row)
        for name in _JSON_FIELDS:
            if isinstance(data.get(name), str):
                data[name] = json.loads(data[name])
        if data.get("images"):
            data = _restore_images(data)
        data.pop("images", None)
        return cls.model_validate(data)


def _row_messages(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every message dict of a row: the transcript and each turn's own sent messages."""
    yield from row.get("messages") or []
    for turn in row.get("turns") or []:
        yield from (turn or {}).get("sent_messages") or []


def _store_images(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Move each data image of a dumped row into its ``images`` list, once, leaving its
    sha256 in the parts; returns the list (empty for a text-only row: nothing is scanned
    but the parts of messages that have them)."""
    stored: dict[str, dict[str, Any]] = {}
    digests: dict[str, str] = {}  # data URL -> digest: an image shown in 6 turns is decoded once
    for message in _row_messages(row):
        for part in message.get("parts") or []:
            url = part.get("url")
            if part.get("type") != "image" or not url or not is_data_url(url):
                continue
            digest = digests.get(url)
            if digest is None:
                mime, data = decode_data_url(url)
                digest = digests[url] = image_digest(data)
                if digest not in stored:
                    width, height = image_size(data)
                    stored[digest] = {
                        "sha256": digest,
                        "mime": mime,
                        "data": data,
                        "width": width,
                        "height": height,
                    }
            part["url"], part["sha256"] = None, digest
    return list(stored.values())


def _restore_images(row: dict[str, Any]) -> dict[str, Any]:
    """A copy of a Parquet row whose image parts hold their data URLs again."""
    urls = {image["sha256"]: data_url(image["data"], image["mime"]) for image in row["images"]}
    data = dict(row)
    data["messages"] = [dict(m) for m in data.get("messages") or []]
    data["turns"] = [
        {**t, "sent_messages": [dict(m) for m in t.get("sent_messages") or []] or None}
        if t.get("sent_messages")
        else t
        for t in data.get("turns") or []
    ]
    for message in _row_messages(data):
        if message.get("parts"):
            message["parts"] = [_restored_part(p, urls) for p in message["parts"]]
    return data


def _restored_part(part: dict[str, Any], urls: dict[str, str]) -> dict[str, Any]:
    digest = part.get("sha256")
    if digest is None:
        return part
    if digest not in urls:
        raise ImageError(f"an image part refers to image {digest[:12]}..., not in the row")
    return {**part, "url": urls[digest], "sha256": None}


def inline_images(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row (``Trajectory.to_row``) with its images back in the parts as data URLs
    and its ``images`` column empty: the JSONL form, readable line by line on its own."""
    if not row.get("images"):
        return row
    data = _restore_images(row)
    data["images"] = []
    return data


RENAMED_COLUMNS = {"agent": "worker"}
"""Row columns of earlier versions -> their names now: ``agent`` held the worker actor's
name, and "agent" names the episode loop only (``played_by``)."""


def renamed_columns(row: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``row`` with each column of an older name under its new one (the new one
    wins where the row has both)."""
    data = dict(row)
    for old, new in RENAMED_COLUMNS.items():
        if old in data:
            value = data.pop(old)
            if data.get(new) is None:
                data[new] = value
    return data


def version_spans(token_versions: list[int]) -> list[tuple[int, int, int]]:
    """``Turn.token_versions`` as spans ``(version, first token, last token)``, in order.

    Example:
        >>> version_spans([3, 3, 4, 4, 4])
        [(3, 0, 1), (4, 2, 4)]
    """
    spans: list[tuple[int, int, int]] = []
    for index, version in enumerate(token_versions):
        if spans and spans[-1][0] == version:
            spans[-1] = (version, spans[-1][1], index)
        else:
            spans.append((version, index, index))
    return spans


def stable_task_id(row: dict[str, Any]) -> str:
    """Derive a task id from a row's content, so resumed runs find the same ids again."""
    text = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _arrow_type(annotation: Any) -> pa.DataType:
    """Map a pydantic field annotation to its Arrow type."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *extras = typing.get_args(annotation)
        for extra in extras:
            if isinstance(extra, ArrowType):
                return extra.arrow_type
            if extra is JsonColumn:
                return pa.string()
        return _arrow_type(base)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"cannot derive an Arrow type for union {annotation}")
        return _arrow_type(args[0])
    if origin is Literal:
        return pa.string()
    if origin is list:
        return pa.list_(_arrow_type(typing.get_args(annotation)[0]))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct(
            [
                pa.field(n, _arrow_type(_annotation_with_metadata(annotation, n)))
                for n in annotation.model_fields
            ]
        )
    simple = {
        str: pa.string(),
        int: pa.int64(),
        float: pa.float64(),
        bool: pa.bool_(),
        bytes: pa.binary(),
    }
    if annotation in simple:
        return simple[annotation]
    if annotation is datetime:
        return pa.timestamp("us", tz="UTC")
    raise TypeError(f"cannot derive an Arrow type for {annotation!r}")


def _annotation_with_metadata(model: type[BaseModel], name: str) -> Any:
    field = model.model_fields[name]
    if field.metadata:
        return Annotated[(field.annotation, *field.metadata)]
    return field.annotation


def _json_text(value: Any) -> str:
    """A JSON column's text. orjson first: a row's tools, verification and task fields cost
    a worker about 16 us an episode through the json module and 2 through orjson; the json
    module where orjson refuses a value (an integer past 64 bits, a verifier's 2**100)."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, ensure_ascii=False, default=str)


_JSON_FIELDS = tuple(
    n for n, f in Trajectory.model_fields.items() if any(m is JsonColumn for m in f.metadata)
)


def trajectory_arrow_schema() -> pa.Schema:
    """The Arrow schema of output rows, derived from ``Trajectory``."""
    return pa.schema(
        [
            pa.field(name, _arrow_type(_annotation_with_metadata(Trajectory, name)))
            for name in Trajectory.model_fields
        ]
    )
