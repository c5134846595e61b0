"""NeMo Gym's row shapes, read into a task's prompt, tools, sampling and fields.

Its envelopes, its ``responses_create_params``, rows whose opening NeMo Gym's servers write,
and refusals of what rayrollout cannot run (each starting ``UNSUPPORTED``); every error names
the file, line and field (``tasks.Fail``). Which agent plays a task read here is
``nemo_gym_agents``'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from rayrollout.data.responses import items_to_messages
from rayrollout.data.schema import Message, SamplingParams, Task, content_part

__all__ = [
    "NEMO_GYM_AGENT",
    "UNSUPPORTED",
    "Fail",
    "from_nemo_gym",
    "is_nemo_gym_task",
    "prompt_messages",
    "seeded_row",
    "short",
    "unwrap",
    "usersim_task",
]

UNSUPPORTED = "NeMo Gym feature not supported"
"""How every refusal of a NeMo Gym feature begins; the feature's name follows the colon."""

_ROLE_ALIASES = {"developer": "system"}
_IMAGE_PARTS = ("input_image", "image_url")
_MEDIA_PARTS = {
    "input_audio": "audio",
    "input_file": "file",
    "file": "file",
    "input_video": "video",
    "video_url": "video",
}

# The seed request fields of NeMo Gym servers whose /seed_session answers the first
# observation (``seeded_row``).
_SEED_REQUESTS = (("task_idx",), ("task_name", "task_ref", "dataset_ref"))

Fail = Callable[[str | None, str], Exception]
"""Builds the error of the row being parsed (``InvalidTaskError``) from a field and a message."""

NEMO_GYM_AGENT = "nemo_gym"
"""The agent of rows whose opening NeMo Gym's own agent or environment server writes."""


def unwrap(row: dict[str, Any], fail: Fail) -> tuple[dict[str, Any], str | None, str | None]:
    """The task row inside NeMo Gym's envelope forms: ``(row, envelope's task id, usersim)``.

    * A materialized task (``nemo_gym.episode_types.is_materialized_task_row``: ``task_id``
      an object and ``task_input`` present) holds the flat row in ``task_input``, some of its
      fields possibly in ``task_input.task_data``; flattened the way NeMo Gym builds the
      flat ``/verify`` body from it (envelope extras < ``task_data`` < ``task_input``, a key
      that differs inside and outside ``task_data`` being an error). Its id is
      ``"<taskset>/<task_id>"``: positional ids ("0", "1", ...) repeat across the tasksets
      of a blended file, and task ids must be unique within a run for ``--resume``.
    * NeMo UserSim's ``{"task_id", "resolved_row"}`` (no prompt beside them; on its own or
      as a materialized task's ``task_input``) reads ``resolved_row`` as the row, with the
      envelope's ``task_id`` (and any other envelope key, ``role_request_params``) added.
      ``usersim`` is then the field that held ``resolved_row``, else None.

    Any other row is returned as it is.
    """
    envelope_id = None
    prefix = ""
    if isinstance(row.get("task_id"), dict) and "task_input" in row:
        row, envelope_id = _materialized(row, fail)
        prefix = "task_input."
    if "resolved_row" in row and not {"responses_create_params", "prompt"} & row.keys():
        resolved = row["resolved_row"]
        if not isinstance(resolved, dict):
            raise fail(
                f"{prefix}resolved_row", f"must be an object (the task row), got {short(resolved)}"
            )
        flat = {k: v for k, v in row.items() if k != "resolved_row"} | resolved
        if "task_id" in row:
            if "task_id" in resolved and resolved["task_id"] != row["task_id"]:
                raise fail(
                    f"{prefix}resolved_row.task_id",
                    f"{short(resolved['task_id'])} differs from the row's task_id "
                    f"{short(row['task_id'])}; keep one",
                )
            flat["task_id"] = row["task_id"]
        return flat, envelope_id, f"{prefix}resolved_row"
    return row, envelope_id, None


def _materialized(row: dict[str, Any], fail: Fail) -> tuple[dict[str, Any], str]:
    """A materialized task's flat row and id (see ``_unwrap``)."""
    ident = row["task_id"]
    for key in ("taskset", "task_id"):
        if not isinstance(ident.get(key), str) or not ident[key]:
            raise fail(
                f"task_id.{key}",
                f"must be a non-empty string, got {short(ident.get(key))} (a NeMo Gym "
                "materialized task's id is {'taskset': ..., 'task_id': ...})",
            )
    task_input = row["task_input"]
    if not isinstance(task_input, dict):
        raise fail("task_input", f"must be an object (the task row), got {short(task_input)}")
    fields = dict(task_input)
    task_data = fields.pop("task_data", {})
    if not isinstance(task_data, dict):
        raise fail("task_input.task_data", f"must be an object, got {short(task_data)}")
    for key in sorted(fields.keys() & task_data.keys()):
        if fields[key] != task_data[key]:
            raise fail(
                f"task_input.{key}",
                f"differs from task_input.task_data.{key}; keep one value for the field",
            )
    extras = {k: v for k, v in row.items() if k not in ("task_id", "task_input")}
    return extras | task_data | fields, f"{ident['taskset']}/{ident['task_id']}"


def _unsupported(feature: str, detail: str) -> str:
    """A refusal's message: the feature named first, then why and what to do."""
    return f"{UNSUPPORTED}: {feature}. {detail}"


def from_nemo_gym(row: dict[str, Any], fail: Fail) -> dict[str, Any]:
    """A NeMo Gym row's prompt, tools, sampling and own fields; ``fields`` is the row whole.

    An empty ``input`` opens the episode one of two ways. Where the row carries the seed
    request of a server whose ``/seed_session`` answers the first observation
    (``seeded_row``: aviary, toolsandbox, terminal_bench_4), the task's ``opening`` is
    ``seed_session`` and its prompt holds ``instructions`` or nothing; the episode takes the
    observation from the server (``environment.nemo_gym.seeded``). Any other empty ``input``
    without ``instructions`` is written by NeMo Gym's agent from the row's other fields
    (``gdpval``'s stirrup agent, ``scicode``'s per-sub-step prompts, ``legal_agent_bench``'s
    Harbor agent): the task's ``opening`` is ``agent`` and its ``agent`` is ``nemo_gym``,
    which hands the row whole to that agent server's ``/run``. Starting such an episode
    from the empty prompt with another agent would be another task, not this one.
    """
    params = row["responses_create_params"]
    field = "responses_create_params.input"
    if not isinstance(params, dict):
        raise fail("responses_create_params", "must be an object")
    if "input" not in params:
        raise fail(field, "missing: the prompt messages")
    metadata = params.get("metadata")
    if isinstance(metadata, dict) and metadata.get("audio_data") is not None:
        raise fail(
            "responses_create_params.metadata.audio_data",
            _unsupported(
                "audio input",
                "NeMo Gym's vLLM model server splices metadata.audio_data into the user "
                "message; rayrollout's messages carry text and images only, so the model "
                "would never hear the audio: run this task with NeMo Gym",
            ),
        )
    instructions = params.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise fail(
            "responses_create_params.instructions",
            f"must be a string (the system prompt), got {short(instructions)}",
        )
    items = params["input"]
    opening = "prompt"
    if isinstance(items, list) and not items:
        if seeded_row(row):
            opening = "seed_session"
        elif not instructions:
            opening = "agent"
        prompt: list[Message] = []
    else:
        prompt = prompt_messages(items, field, fail)
    data: dict[str, Any] = {
        "prompt": _with_instructions(instructions, prompt),
        "fields": dict(row),
    }
    if opening != "prompt":
        data["opening"] = opening
    if opening == "agent":
        data["agent"] = NEMO_GYM_AGENT
    task_id = row.get("task_id")
    if task_id is not None:
        data["task_id"] = task_id
    if isinstance(row.get("environment"), str):
        data["environment"] = row["environment"]
    if params.get("tools") is not None:
        data["tools"] = params["tools"]
    sampling = {
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "max_tokens": params.get("max_output_tokens"),
    }
    if any(v is not None for v in sampling.values()):
        try:
            data["sampling"] = SamplingParams.model_validate(sampling)
        except ValidationError as exc:
            raise fail("responses_create_params", exc.errors()[0]["msg"]) from None
    return data


def seeded_row(row: dict[str, Any]) -> bool:
    """Whether a row with an empty ``input`` is opened by its server's ``/seed_session``.

    Such a row carries the seed request of a server that answers with the first
    observation: ``task_idx`` (aviary and toolsandbox: the index of the environment or
    scenario to start), or ``task_name``, ``task_ref`` and ``dataset_ref`` (terminal_bench_4:
    the pinned task whose sandbox the seed prepares).
    """
    return any(all(key in row for key in keys) for keys in _SEED_REQUESTS)


def _with_instructions(instructions: str | None, prompt: list[Message]) -> list[Message]:
    """The prompt as the model sees it under NeMo Gym: ``instructions`` lead the system message.

    The Responses API puts ``instructions`` before the input as a system message; NeMo
    Gym's Chat Completions conversion joins them and the input's leading system messages
    into one (chat templates admit one system message, first), separated by blank lines.
    """
    if not instructions:
        return prompt
    leading = [instructions]
    rest = list(prompt)
    while rest and rest[0].role == "system":
        leading.append(rest.pop(0).content or "")
    return [Message(role="system", content="\n\n".join(leading)), *rest]


def prompt_messages(value: Any, field: str, fail: Fail) -> list[Message]:
    """Chat messages from a prompt: a string, chat messages, or Responses-API input items.

    Items are checked here, each error naming its index, and converted by
    ``responses.items_to_messages``, the one conversion of Responses items to chat messages.
    ``reasoning`` items have no chat equivalent and are left out of the prompt (the row,
    kept in ``fields``, still holds them): rayrollout's messages carry no reasoning, and chat
    templates of reasoning models drop earlier turns' reasoning when they render a prompt.
    """
    if isinstance(value, str):
        if not value.strip():
            raise fail(field, "empty prompt")
        return [Message(role="user", content=value)]
    if not isinstance(value, list):
        raise fail(field, f"must be a string or a list of messages, got {type(value).__name__}")
    _check_items(value, field, fail)
    messages = items_to_messages(value)
    if not messages:
        raise fail(field, "empty prompt: no messages")
    return messages


def _check_items(items: list[Any], field: str, fail: Fail) -> None:
    """Raise for the first item ``items_to_messages`` would drop or misread."""
    called: set[str] = set()
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise fail(where, "must be a message object with 'role' and 'content'")
        kind = item.get("type") or "message"
        if kind == "message":
            if "role" not in item:
                raise fail(where, "must be a message object with 'role' and 'content'")
            role = item["role"]
            if not isinstance(role, str):
                raise fail(f"{where}.role", f"must be a string, got {short(role)}")
            if _ROLE_ALIASES.get(role, role) not in ("system", "user", "assistant"):
                raise fail(f"{where}.role", f"unsupported role {role!r}")
            _text(item.get("content"), f"{where}.content", fail)
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise fail(f"{where}.name", "missing: a function_call names the tool it calls")
            arguments = item.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                raise fail(
                    f"{where}.arguments",
                    f"must be the arguments as JSON text, got {short(arguments)}",
                )
            call_id = item.get("call_id") or item.get("id")
            if not isinstance(call_id, str):
                raise fail(
                    f"{where}.call_id",
                    f"must be a string (the id its function_call_output answers), got "
                    f"{short(call_id)}",
                )
            called.add(call_id)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or call_id not in called:
                raise fail(
                    f"{where}.call_id",
                    f"answers no earlier function_call (call_id {short(call_id)}): a tool's "
                    "output must follow the call it answers",
                )
            _text(item.get("output"), f"{where}.output", fail)
        elif kind != "reasoning":
            raise fail(
                f"{where}.type",
                f"unsupported item type {short(kind)}: rayrollout reads message, "
                "function_call, function_call_output and reasoning items",
            )


def _text(content: Any, field: str, fail: Fail) -> str:
    """Message content as text: a string, or a list of text and image parts (checked here,
    kept as parts by ``items_to_messages``).

    Any other media part (audio, file, video) is refused rather than dropped: rayrollout's
    messages carry text and images only, and a task whose audio silently vanished would
    still run and be scored, on a question the model cannot hear.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise fail(field, f"must be text or a list of text parts, got {short(content)}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _IMAGE_PARTS:
            try:
                content_part(part)
            except ValueError as exc:
                raise fail(f"{field}[{j}]", str(exc)) from None
            continue
        if isinstance(kind, str) and kind in _MEDIA_PARTS:
            raise fail(
                f"{field}[{j}]",
                _unsupported(
                    f"{_MEDIA_PARTS[kind]} input",
                    f"The content part is of type {kind!r}, and rayrollout's messages carry "
                    "text and images only, so the model would never see the "
                    f"{_MEDIA_PARTS[kind]}: run this task with NeMo Gym",
                ),
            )
        if not (
            isinstance(part, dict)
            and kind in (None, "text", "input_text", "output_text")
            and isinstance(part.get("text"), str)
        ):
            raise fail(f"{field}[{j}]", f"must be a text part {{'text': ...}}, got {short(part)}")
        texts.append(part["text"])
    return "".join(texts)


def short(value: Any) -> str:
    """A value as it reads in an error message: its repr, cut to 80 characters."""
    try:
        text = repr(value)
    except RecursionError:  # a hostile row nested past what repr follows
        return f"<a {type(value).__name__} nested too deeply to show>"
    return text if len(text) <= 80 else text[:77] + "..."


def usersim_task(row: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """A NeMo UserSim row as a task's data: opened and carried on by NeMo Gym.

    In NeMo UserSim's ``{"task_id", "resolved_row"}`` (alone or as a materialized task's
    ``task_input``) a simulated user, run by NeMo Gym's ``nemo_user_sim`` environment server
    from the persona and probe in ``resolved_row``, opens the conversation, and that server
    scores it with its probe scorer; ``resolved_row`` holds no prompt. So the task's
    ``opening`` is ``agent`` and its agent ``nemo_gym``, which hands the row to that
    environment server; ``fields`` is the row as read (``row``), envelope and all, which is
    what the server takes back. ``flat`` is the row unwrapped (``unwrap``), for its id and
    environment.
    """
    data: dict[str, Any] = {
        "prompt": [],
        "opening": "agent",
        "agent": NEMO_GYM_AGENT,
        "fields": dict(row),
    }
    if flat.get("task_id") is not None:
        data["task_id"] = flat["task_id"]
    if isinstance(flat.get("environment"), str):
        data["environment"] = flat["environment"]
    return data


def is_nemo_gym_task(task: Task) -> bool:
    """Whether a task was read from a NeMo Gym row (its ``fields`` hold the row whole): an
    exact copy of such a row is another task, as NeMo Gym plays every line it reads."""
    fields = task.fields
    return (
        "responses_create_params" in fields
        or "resolved_row" in fields
        or ("task_input" in fields and isinstance(fields.get("task_id"), dict))
    )
