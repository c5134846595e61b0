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

from rayrollout.data.config import EpisodeConfig
from rayrollout.data.images import data_url, image_bytes
from rayrollout.data.schema import ContentPart, Message, Task, ToolCall
from rayrollout.envkit.errors import ToolError
from rayrollout.envkit.tool_args import ToolCallRejected, parse_arguments, unknown_tool

__all__ = [
    "Environment",
    "Episode",
    "Hosting",
    "ToolError",
    "ToolResult",
    "Verification",
    "episode_limits",
    "own_turn_limit",
    "tool",
    "tool_result",
]

Hosting = Literal["inline", "serve"]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


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
        default_agent: The agent that plays its tasks when neither the task row (``agent``)
            nor the run (the config's ``agent:``, ``--agent``) names one; None: the built-in
            ``tool_loop``. Reset/step sources name ``reset_step``, so naming the environment
            is enough to play it (``agent_for`` may choose per task).
        max_turns: Its own limit on the model calls of an episode (a game's turn limit),
            used instead of the run's default ``episode.max_turns`` unless the config sets
            that key itself; None: no limit of its own (``turn_limit`` may answer per
            episode).
    """

    name: ClassVar[str] = ""
    default_hosting: ClassVar[Hosting] = "inline"
    needs_vision: ClassVar[bool] = False
    default_agent: ClassVar[str | None] = None
    max_turns: ClassVar[int | None] = None
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
    def agent_for(cls, task: Task) -> str | None:
        """The agent that plays ``task`` when neither the row nor the run names one: the
        class's ``default_agent``. Override it when the choice depends on the row (a field
        naming the agent the environment's own framework would run).

        The whole order is ``rayrollout.agentkit.registry.resolve_agent``'s: the row's
        ``agent``, the run's, this answer, then ``tool_loop``.
        """
        return cls.default_agent

    def turn_limit(self) -> int | None:
        """This episode's own limit on model calls, asked once ``setup`` has run (a game
        made by id knows its limit only then): the class's ``max_turns`` unless a subclass
        reads it from what it made. None: the run's ``episode.max_turns`` applies."""
        return type(self).max_turns

    @classmethod
    def config_problem(cls, args: dict[str, Any]) -> str | None:
        """What is wrong with the config's ``args`` for this environment, found before the
        run without playing it, as one line naming the fix (a class that cannot be
        imported, a URL that does not answer, an id the source does not know); None when
        nothing is (the default).

        ``collect`` asks it once per environment name before anything starts (after
        ``unavailable_reason``) and stops with the line (exit 2). It should answer within a
        second or so; a probe over the network keeps to a short timeout.
        """
        return None

    @classmethod
    def task_problem(cls, task: Task, args: dict[str, Any]) -> str | None:
        """What makes ``task`` unplayable by this environment with ``args``, found before
        its episodes start, as one line naming the fix (the row names an id the source does
        not know); None when nothing does (the default).

        ``collect`` asks it of every row it reads (so it must be cheap: a lookup, not a
        probe), and stops the run at the first row with a problem, naming how many rows
        share it.
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


def own_turn_limit(session: object) -> int | None:
    """The environment's own turn limit for one episode's session (``Environment.turn_limit``),
    or None where it declares none or the session cannot say.

    A session kind that speaks to a server answers it itself (a ``turn_limit()`` method of
    its own); an inline session asks its environment instance; a session whose instance
    lives elsewhere (a Serve replica) has none to ask.
    """
    ask = getattr(session, "turn_limit", None)
    if not callable(ask):
        ask = getattr(getattr(session, "env", None), "turn_limit", None)
    if not callable(ask):
        return None
    limit = ask()
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return None
    return limit


def episode_limits(limits: EpisodeConfig, session: object) -> EpisodeConfig:
    """The limits one episode plays under: the run's ``limits``, with the environment's own
    turn limit (``own_turn_limit``) as ``max_turns`` unless the config sets ``max_turns``
    itself (a key it gives wins; only the default gives way). The engine asks once the
    session is set up; an agent may ask again where the limit is known later (the
    ``reset_step`` agent, after reset: a game that draws its size there), since the answer
    still counts ``max_turns`` as not set by the config.

    Example: a GEM game of 10 guesses, in a run whose config leaves ``episode.max_turns``
    at its default of 8, plays its 10 turns; with ``episode: {max_turns: 4}`` it plays 4.
    """
    if "max_turns" in limits.model_fields_set:
        return limits
    own = own_turn_limit(session)
    if own is None or own == limits.max_turns:
        return limits
    # Constructed, not copied with an update: a copy would count max_turns as set.
    values = {**dict(limits), "max_turns": own}
    return EpisodeConfig.model_construct(_fields_set=set(limits.model_fields_set), **values)
