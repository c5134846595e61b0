"""The environment contract: typed async tools, an async verifier, per-episode instances.

An environment is a subclass of ``Environment`` with methods marked ``@tool`` and one
``verify`` method. One instance serves one episode, so per-episode state is plain attributes
on ``self``; ``setup``/``close`` bracket the episode (``close`` runs on failures too). The
tool's signature and Google-style docstring become its OpenAI function schema, and its
arguments are validated against that schema before the tool runs.

Errors: raise ``ToolError`` for a problem the model should read and may fix (bad input,
nothing found); any other exception from a tool is an environment failure that ends the
episode with ``status="error"``.

Example::

    class EchoEnv(Environment):
        name = "echo"

        @tool
        async def echo(self, text: str) -> str:
            \"\"\"Repeat the text.

            Args:
                text: What to repeat.
            \"\"\"
            return text

        async def verify(self, episode: Episode) -> Verification:
            return Verification(reward=float(bool(episode.tool_calls())))
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from rayrollout.data.images import data_url, image_bytes
from rayrollout.data.schema import ContentPart, Message, Task, ToolCall
from rayrollout.environment.tool_args import ToolCallRejected, parse_arguments, unknown_tool
from rayrollout.errors import EnvironmentBoundaryError

__all__ = [
    "Environment",
    "Episode",
    "Hosting",
    "ToolError",
    "ToolResult",
    "Verification",
    "tool",
    "tool_result",
]

Hosting = Literal["inline", "serve"]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class ToolError(EnvironmentBoundaryError):
    """A tool problem the model is told about (the episode goes on)."""


class ToolResult(BaseModel):
    """What a tool call hands back to the model: text, or text and images.

    A tool may return an image: a Pillow image, image file bytes, an MCP image content item
    ``{"type": "image", "data": <base64>, "mimeType": ...}``, or a list mixing those with
    text. The result then holds ``parts`` (in order) and ``content`` their text joined.
    """

    content: str
    is_error: bool = False
    parts: list[ContentPart] | None = None


def tool_result(value: Any) -> ToolResult:
    """A tool's return value as its result: text as it is, an image or a list holding
    images as parts, anything else as JSON text."""
    if isinstance(value, str):
        return ToolResult(content=value)
    items = value if isinstance(value, list | tuple) else [value]
    if any(image_bytes(item) is not None for item in items):
        parts = [_part(item) for item in items]
        texts = [p.text for p in parts if p.type == "text" and p.text is not None]
        return ToolResult(content="\n".join(texts), parts=parts)
    return ToolResult(content=json.dumps(value, ensure_ascii=False, default=str))


def _part(item: Any) -> ContentPart:
    """One item of a tool's list result as a content part."""
    found = image_bytes(item)
    if found is not None:
        return ContentPart(type="image", url=data_url(found[1], found[0]))
    if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
        return ContentPart(type="text", text=item["text"])  # an MCP text item
    text = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False, default=str)
    return ContentPart(type="text", text=text)


class Verification(BaseModel):
    """The verifier's verdict: a reward and whatever explains it.

    A reward is any finite float (a penalty of -1, a score of 0 to 3, a sum of step
    rewards past 1); NaN and infinities are refused. What needs a range (an export's
    threshold, a plot's axis) says so where it applies; nothing clips a reward.
    """

    model_config = ConfigDict(extra="forbid")

    reward: float = Field(
        allow_inf_nan=False, description="The episode's reward: any finite float."
    )
    details: dict[str, Any] = Field(default_factory=dict, description="Why this reward.")

    @field_validator("reward", mode="before")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        # Said here in words: pydantic's own "Input should be a finite number" names no fix.
        if isinstance(value, int | float) and not math.isfinite(value):
            raise ValueError(
                f"a reward must be a finite number, got {value!r}: a verifier that can give "
                "NaN or infinity (a division by zero, a log of 0) must map it to a number"
            )
        return value


class Episode(BaseModel):
    """What a verifier reads: the task and the whole conversation."""

    task: Task
    messages: list[Message]

    def tool_calls(self) -> list[ToolCall]:
        """Every tool call the model made, in order."""
        return [c for m in self.messages if m.role == "assistant" for c in m.tool_calls or []]

    def final_answer(self) -> str:
        """Text of the last assistant message ('' when the model never answered)."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message.content or ""
        return ""


def tool(fn: F) -> F:
    """Mark an ``async def`` method of an ``Environment`` as a tool the model can call."""
    is_async = inspect.iscoroutinefunction(fn)  # a bool: narrowing ``fn`` would lose ``F``
    if not is_async:
        raise TypeError(
            f"@tool {fn.__qualname__} must be 'async def' (wrap sync code in asyncio.to_thread)"
        )
    fn.__rayrollout_tool__ = True  # type: ignore[attr-defined]
    return fn


class _ToolSpec:
    """A tool's argument model and OpenAI schema, built once per class."""

    def __init__(self, name: str, fn: Callable[..., Awaitable[Any]]) -> None:
        self.name = name
        description, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
        hints = get_type_hints(fn)
        fields: dict[str, Any] = {}
        for param in list(inspect.signature(fn).parameters.values())[1:]:
            if param.name not in hints:
                raise TypeError(
                    f"tool {fn.__qualname__}: parameter '{param.name}' needs a type hint"
                )
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (
                hints[param.name],
                Field(default, description=arg_docs.get(param.name)),
            )
        self.arguments = create_model(
            f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        parameters = self.arguments.model_json_schema()
        parameters.pop("title", None)
        for prop in parameters.get("properties", {}).values():
            prop.pop("title", None)
        parameters["additionalProperties"] = False
        self.schema: dict[str, Any] = {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary and per-argument descriptions."""
    summary, _, rest = doc.partition("\nArgs:")
    arg_docs: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        match = re.match(r"^\s{2,}(\w+)(?:\s*\(.*?\))?:\s*(.*)$", line)
        if match and (current is None or len(line) - len(line.lstrip()) <= 8):
            current = match.group(1)
            arg_docs[current] = match.group(2).strip()
        elif line.strip() and current and not re.match(r"^\S", line):
            arg_docs[current] += " " + line.strip()
        elif re.match(r"^\S", line):
            break
    return " ".join(summary.split()), arg_docs


class Environment:
    """Base class of every environment. One instance runs one episode.

    Class attributes:
        name: A label only. The environment's name is the one it is registered under (its
            entry point, its key under the config's ``environments``, or its
            ``"module:Class"`` path): tasks name that one, and hosting, sessions and config
            settings are all looked up by it, never by this attribute, so one class can run
            under two names with different constructor ``args``.
        default_hosting: Where it runs unless the config says otherwise: ``"inline"`` in the
            worker actors (zero hops; light, non-blocking tools) or ``"serve"`` on Ray Serve
            replicas (CPU-heavy or isolated tools).
        needs_vision: True when its tasks can only be solved by a model that sees images;
            ``rayrollout demo``, whose scripted policy does not, leaves it out and says so.
    """

    name: ClassVar[str] = ""
    default_hosting: ClassVar[Hosting] = "inline"
    needs_vision: ClassVar[bool] = False
    _tool_specs: ClassVar[dict[str, _ToolSpec]]

    def __init__(self, task: Task) -> None:
        """One episode's instance. A subclass may take keyword arguments after ``task``: the
        config's ``environments.NAME.args`` are passed to them wherever it is built."""
        self.task = task

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._tool_specs = {
            name: _ToolSpec(name, member)
            for name, member in inspect.getmembers(cls, inspect.iscoroutinefunction)
            if getattr(member, "__rayrollout_tool__", False)
        }

    async def setup(self) -> None:
        """Create per-episode state (a game board, a database). Default: nothing."""

    async def close(self) -> None:
        """Release per-episode state; runs after every episode, failed ones included."""

    async def verify(self, episode: Episode) -> Verification:
        """Score the finished episode."""
        raise NotImplementedError(
            f"environment {type(self).__qualname__} must define 'async def verify'"
        )

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """The OpenAI Chat Completions function schemas of this environment's tools."""
        return [spec.schema for spec in cls._tool_specs.values()]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this machine cannot run the environment, as one line naming the fix; None
        when it can (the default).

        Override it when the environment needs what ``pip`` does not install: a system
        package, a device, privileges. ``collect`` asks before anything starts and stops
        with this line (exit 2) instead of writing a failed row per episode; ``rayrollout
        demo`` leaves such an environment out and prints the line. It is asked on the
        machine that starts the run (not when the run joins a cluster, whose nodes may
        differ), and should answer within a second or so.
        """
        return None

    @classmethod
    def is_stateful(cls) -> bool:
        """Whether episodes need one instance kept alive between calls (setup/close defined)."""
        return cls.setup is not Environment.setup or cls.close is not Environment.close

    async def call_tool(self, name: str, arguments: str) -> ToolResult:
        """Run one tool call from the model; model mistakes come back as error results."""
        spec = self._tool_specs.get(name)
        try:
            if spec is None:
                raise unknown_tool(name, self._tool_specs)
            args = parse_arguments(name, arguments, spec.arguments)
        except ToolCallRejected as exc:
            return ToolResult(content=str(exc), is_error=True)
        try:
            value = await getattr(self, name)(**args)
        except ToolError as exc:
            return ToolResult(content=f"Error: {exc}", is_error=True)
        return tool_result(value)
