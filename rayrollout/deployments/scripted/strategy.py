"""The scripted policy's moves: call the environment's tool, then answer from its result.

A fixed strategy per environment, chosen by the tools the request offers. It stands in for
the model's judgement in tests, the demo and overhead benchmarks; it says nothing about
model quality. A user message may carry ``[[sleep=SECONDS]]`` to make the call slow (for
timeout tests). A system or user message may carry ``[[replies=["...", "..."]]]`` (a JSON
list): the k-th answer of the conversation is then its k-th reply (the last one again past
the end): a string as plain text (scripted actions for environments that read the model's
text, such as skyrl-gym's and GEM's), an object ``{"tool": NAME, "arguments": {...}}`` as
one call of that tool (scripted tool calls, such as an OpenEnv MCP environment's).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

SLEEP_DIRECTIVE = re.compile(r"\[\[sleep=([0-9.]+)\]\]")
REPLIES_DIRECTIVE = "[[replies="


@dataclass
class Action:
    """Either a tool call (name + JSON arguments) or a final text answer."""

    tool: str | None = None
    arguments: str = ""
    text: str | None = None


def requested_sleep(messages: list[dict[str, Any]]) -> float:
    """Seconds of delay asked for by a ``[[sleep=S]]`` directive in the user messages."""
    for message in messages:
        if message.get("role") == "user":
            match = SLEEP_DIRECTIVE.search(_text(message.get("content")))
            if match:
                return float(match.group(1))
    return 0.0


def scripted_replies(messages: list[dict[str, Any]]) -> list[str | dict[str, Any]] | None:
    """The replies of the first ``[[replies=[...]]]`` directive in a system or user message."""
    for message in messages:
        text = _text(message.get("content"))
        start = text.find(REPLIES_DIRECTIVE) if message.get("role") in ("system", "user") else -1
        if start < 0:
            continue
        try:
            replies, _ = json.JSONDecoder().raw_decode(text, start + len(REPLIES_DIRECTIVE))
        except json.JSONDecodeError:
            continue
        if isinstance(replies, list) and replies and all(_reply(r) for r in replies):
            return replies
    return None


def next_action(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Action:
    """Decide the next move from the chat so far and the offered (chat-form) tools."""
    replies = scripted_replies(messages)
    if replies is not None:
        answered = sum(1 for m in messages if m.get("role") == "assistant")
        reply = replies[min(answered, len(replies) - 1)]
        if isinstance(reply, dict):
            return Action(tool=reply["tool"], arguments=json.dumps(reply.get("arguments", {})))
        return Action(text=reply)
    names = [t.get("function", t).get("name") for t in tools]
    prompt = next(
        (_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    prompt = SLEEP_DIRECTIVE.sub("", prompt).strip()
    results = [m for m in messages if m.get("role") == "tool"]
    calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    if not names:
        return Action(text=f"I have no tools for this. You asked: {prompt}")
    if not results:
        return _first_call(names, tools, prompt)
    result = _text(results[-1].get("content"))
    last_call = calls[-1]["function"] if calls else {"name": names[0], "arguments": "{}"}
    return Action(text=_answer(last_call, result))


def _reply(reply: Any) -> bool:
    """Whether a scripted reply is usable: text, or ``{"tool": NAME, "arguments": {...}}``."""
    if isinstance(reply, dict):
        return isinstance(reply.get("tool"), str) and isinstance(reply.get("arguments", {}), dict)
    return isinstance(reply, str)


def _first_call(names: list[str], tools: list[dict[str, Any]], prompt: str) -> Action:
    if "get_weather" in names:
        match = re.search(r"\bin ([^?.!]+?)\s*[?.!]*$", prompt)
        city = match.group(1).strip() if match else prompt
        return Action(tool="get_weather", arguments=json.dumps({"city": city}))
    if "calculator" in names:
        match = re.search(r"[Ww]hat is (.+?)\?", prompt)
        expression = match.group(1) if match else _longest_expression(prompt)
        return Action(tool="calculator", arguments=json.dumps({"expression": expression.strip()}))
    if "run_python" in names:
        match = re.search(r"`(\w+)\(([^`]*)\)` that returns `([^`]+)`", prompt)
        if match:
            name, params, expression = match.groups()
            code = f"def {name}({params}):\n    return {expression}\n"
        else:
            code = "print('hello')\n"
        return Action(tool="run_python", arguments=json.dumps({"code": code}))
    return Action(tool=names[0], arguments=json.dumps(_fill_arguments(tools[0], prompt)))


def _answer(call: dict[str, Any], result: str) -> str:
    name = call.get("name")
    if name == "get_weather":
        return f"Here is the current weather: {result}"
    if name == "calculator":
        if result.startswith("Error"):
            return f"I could not compute it. {result}"
        return f"The answer is \\boxed{{{result}}}."
    if name == "run_python":
        code = json.loads(call.get("arguments") or "{}").get("code", "")
        return f"Here is the function:\n```python\n{code}```"
    return f"The tool said: {result}"


def _fill_arguments(tool: dict[str, Any], prompt: str) -> dict[str, Any]:
    """Arguments for an unknown tool: the prompt for every string, zero for numbers."""
    params = tool.get("function", tool).get("parameters") or {}
    filled: dict[str, Any] = {}
    for key, spec in (params.get("properties") or {}).items():
        kind = spec.get("type")
        filled[key] = {"integer": 0, "number": 0, "boolean": False}.get(kind, prompt)
    return filled


def _longest_expression(text: str) -> str:
    runs = re.findall(r"[0-9+\-*/().% ]+", text)
    return max(runs, key=len, default=text).strip()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
