"""Policy calls; one job: a model call over the OpenAI protocol, its retries and its errors.

Chat Completions, token-id ``/completions`` or the Responses API.

One ``PolicyClient`` per worker shares one connection pool; Chat Completions and token-id
``/completions`` go through ``policy.http``, the Responses API through ``openai``. Retries are
recorded on the turn; what is left becomes ``PolicyError`` or ``PolicyTimeout``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayrollout.data.config import PolicyConfig
from rayrollout.data.convert import (
    chat_tools_to_responses,
    messages_to_responses_input,
    responses_output_to_message,
)
from rayrollout.data.schema import (
    ContentPart,
    FunctionCall,
    Message,
    SamplingParams,
    ToolCall,
    Turn,
)
from rayrollout.policy.call import PolicyReply, PolicyRequest
from rayrollout.policy.errors import PolicyError, PolicyTimeout
from rayrollout.policy.http import (
    HttpStatusError,
    HttpTimeout,
    HttpTransportError,
    PolicyHttp,
    backoff_s,
)
from rayrollout.policy.model_logprobs import constraint_of, record_model_logprobs
from rayrollout.policy.tokens import (
    DeltaRenderer,
    TemplateError,
    chat_template_tokenizer,
    parse_hermes_tool_calls,
    tool_call_structural_tag,
)

if TYPE_CHECKING:  # the gate imports this module's errors
    import openai

    from rayrollout.policy.gate import PolicyGate

__all__ = ["PolicyClient", "PolicyError", "PolicyTimeout", "chat_reply"]

ABORTED = "abort"
"""The finish reason of a call the server stopped with its tokens kept (vLLM's)."""


class _NotRaised(PolicyError):
    """Stands for an ``openai`` error class while ``openai`` is not imported (nothing raises
    it; a leaf of the tree, so an ``except`` naming it catches nothing else)."""


def _openai_error(name: str) -> type[Exception]:
    """``openai``'s error class ``name``, or one nothing raises when ``openai`` was never
    imported. The SDK is imported only by the Responses API (``openai_client``), the one
    path that can raise its errors: importing it in every worker cost 0.3 s of start-up."""
    module = sys.modules.get("openai")
    return getattr(module, name) if module is not None else _NotRaised


@dataclass(slots=True)
class _Call:
    """One model call as ``complete`` resolved it: the request, with the session's routing
    header and the tool choice for this turn."""

    request: PolicyRequest
    headers: dict[str, str] | None
    tool_choice: str
    failed: list[str] = field(default_factory=list)
    """What each failed try of this call got, for its turn (``PolicyHttp.post`` appends)."""


class PolicyClient:
    """Calls one policy endpoint for many concurrent episodes.

    With a ``gate`` (a worker's ``PolicyGate``) every call passes it: held while the engine
    pauses for a weight update, its turn stamped with the version it went out under.
    """

    def __init__(
        self,
        config: PolicyConfig,
        base_url: str,
        max_connections: int = 1000,
        gate: PolicyGate | None = None,
        api_key: str | None = None,
    ) -> None:
        self.config = config
        self.gate = gate
        self.base_url = base_url
        self.max_connections = max_connections
        # Given by the worker (the driver's key, passed as data: engine/secret_env.py), else
        # this process's environment (a cluster whose nodes were started with the key set).
        self.api_key = api_key or os.environ.get(config.api_key_env) or "not-needed"
        self.http = PolicyHttp(
            base_url, self.api_key, config.timeout_s, config.max_retries, max_connections
        )
        self._openai: openai.AsyncOpenAI | None = None  # the Responses API only
        self._delta_renderer: DeltaRenderer | None = None
        if config.prompt_mode == "token_ids":
            self.prepare()

    def prepare(self) -> None:
        """Load now what the first call would: in token-ids mode the tokenizer and its chat
        template (``transformers``' import, seconds of CPU). Loaded at the first call, it
        held the event loop, so every episode of a worker's first chunk waited for it and
        vLLM saw that worker's requests trickle in. A failure is left for the calls, which
        load again and report it (each episode records it)."""
        if self.config.prompt_mode != "token_ids" or self._delta_renderer is not None:
            return
        try:
            self._delta_renderer = self._load_renderer()
        except Exception:  # the first call loads again and says what went wrong
            pass

    @property
    def openai_client(self) -> openai.AsyncOpenAI:
        if self._openai is None:
            import httpx2
            import openai

            # httpx's pool scans every connection on each request: at hundreds of
            # concurrent episodes it dominated the worker's CPU. aiohttp's does not.
            limits = httpx2.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=self.max_connections,
            )
            self._openai = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self.api_key,
                timeout=self.config.timeout_s,
                max_retries=self.config.max_retries,
                http_client=openai.DefaultAioHttpClient(
                    timeout=self.config.timeout_s, limits=limits
                ),
            )
        return self._openai

    async def close(self) -> None:
        await self.http.close()
        if self._openai is not None:
            await self._openai.close()

    def _brief(self, text: str, limit: int = 300) -> str:
        """Server text for an error message, short, with the API key blanked: a server may
        echo the key it rejected ("Incorrect API key provided: sk-...")."""
        key = self.api_key
        if key and key != "not-needed":
            text = text.replace(key, "[api key]")
        return _brief(text, limit)

    def _sampling(self, sampling: SamplingParams | None) -> dict[str, Any]:
        cfg = self.config
        params = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens}
        if sampling is not None:
            params.update(sampling.model_dump(exclude_none=True))
        return {k: v for k, v in params.items() if v is not None}

    async def complete(self, request: PolicyRequest) -> PolicyReply:
        """One model call; returns the assistant message and the turn's record."""
        tool_choice = self.config.tool_choice
        if tool_choice == "required" and request.last_turn:
            tool_choice = self.config.last_turn_tool_choice
        session_id = request.session_id
        headers = {"x-session-id": session_id} if session_id else None
        call = _Call(request, headers, tool_choice)
        if self.gate is None:
            return await self._complete(call)
        return await self.gate.call(
            session_id or "", call.request.history, lambda kept: self._complete(call, kept)
        )

    async def _complete(self, call: _Call, kept: PolicyReply | None = None) -> PolicyReply:
        """The call and its retries of unusable answers, timed. With ``kept`` (a reply the
        server stopped, ``finish_reason`` 'abort'), the call goes on from its prompt plus
        the kept tokens where it can (``_token_ids``), else it is made again."""
        started = kept.turn.started_at if kept is not None else time.time()
        call.failed = []  # a call the gate aborted and sent again: only this run's tries
        text: str | None = None
        # An answer that is not JSON, or not shaped like one, is retried like a 5xx (the
        # openai client retries only transport failures), with the same max_retries limit.
        for attempt in range(self.config.max_retries + 1):
            try:
                message, turn, text = await self._call(call, kept)
                break
            except _UnusableAnswer as exc:
                if attempt >= self.config.max_retries:
                    raise PolicyError(
                        f"{exc} (after {self.config.max_retries} retries)"
                    ) from exc.__cause__
                call.failed.append(str(exc))
                await asyncio.sleep(backoff_s(attempt))
        turn.started_at = started
        turn.seconds = time.time() - started
        turn.retries = len(call.failed)
        turn.retry_errors = [self._brief(e, _RETRY_ERROR_CHARS) for e in call.failed]
        if kept is not None:
            turn.retries += kept.turn.retries
            turn.retry_errors = kept.turn.retry_errors + turn.retry_errors
        return PolicyReply(message, turn, text)

    async def _call(
        self, call: _Call, kept: PolicyReply | None
    ) -> tuple[Message, Turn, str | None]:
        """One request (the openai client's own retries included), errors as policy errors;
        the raw completion text where the answer is text (token-ids mode)."""
        try:
            if self.config.prompt_mode == "token_ids":
                reply = await self._token_ids(call, kept)
            elif self.config.api == "responses":
                reply = (*await self._responses(call), None)
            else:
                reply = (*await self._chat(call), None)
            if reply[1].finish_reason != ABORTED:  # a stopped call is scored once it ends
                await self._model_logprobs(call, reply[1])
            return reply
        except TemplateError as exc:
            raise PolicyError(str(exc)) from exc
        except (HttpTimeout, _openai_error("APITimeoutError")) as exc:
            raise PolicyTimeout(
                f"policy call to {self.base_url} timed out after {self.config.timeout_s}s "
                f"({self.config.max_retries} retries)"
            ) from exc
        except HttpStatusError as exc:
            raise PolicyError(
                f"policy server {self.base_url} answered HTTP {exc.status}: "
                f"{self._brief(exc.message)}"
            ) from exc
        except _openai_error("APIStatusError") as exc:  # openai.APIStatusError
            status, text = getattr(exc, "status_code", "?"), getattr(exc, "message", str(exc))
            raise PolicyError(
                f"policy server {self.base_url} answered HTTP {status}: {self._brief(text)}"
            ) from exc
        except HttpTransportError as exc:
            raise PolicyError(
                f"policy call to {self.base_url} failed after {self.config.max_retries} "
                f"retries: {self._brief(str(exc))}"
            ) from exc
        except _openai_error("APIError") as exc:
            raise PolicyError(
                f"policy call to {self.base_url} failed: {self._brief(str(exc))}"
            ) from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSON or shape
            raise _UnusableAnswer(
                f"policy server {self.base_url} gave an unusable answer: "
                f"{type(exc).__name__}: {self._brief(str(exc))}"
            ) from exc

    async def _model_logprobs(self, call: _Call, turn: Turn) -> None:
        """The turn's forced tokens and the model's own logprobs (``policy.model_logprobs``)."""
        constraint = constraint_of(call.request.tools, call.tool_choice, self.config.extra_body)
        await record_model_logprobs(
            turn,
            constraint,
            self.config.model_logprobs,
            self.config.model,
            lambda path, body: self.http.post(path, body, call.headers, call.failed),
        )

    async def _chat(self, call: _Call) -> tuple[Message, Turn]:
        cfg = self.config
        payload: dict[str, Any] = {
            "model": cfg.model,
            "messages": [m.to_openai() for m in call.request.messages],
            **self._sampling(call.request.sampling),
        }
        if call.request.tools:
            payload["tools"] = call.request.tools
            payload["tool_choice"] = call.tool_choice
            if call.tool_choice == "required":  # one call per turn; several loop on weak models
                payload["parallel_tool_calls"] = False
        extra_body = dict(cfg.extra_body)
        if cfg.return_token_ids:
            payload["logprobs"] = True
            extra_body["return_token_ids"] = True
        body = await self.http.post(
            "/chat/completions", {**payload, **extra_body}, call.headers, call.failed
        )
        return chat_reply(body, self.base_url)

    async def _responses(self, call: _Call) -> tuple[Message, Turn]:
        cfg = self.config
        params = self._sampling(call.request.sampling)
        if "max_tokens" in params:
            params["max_output_tokens"] = params.pop("max_tokens")
        params.pop("seed", None)
        payload: dict[str, Any] = {
            "model": cfg.model,
            "input": messages_to_responses_input(call.request.messages),
            **params,
        }
        if call.request.tools:
            payload["tools"] = chat_tools_to_responses(call.request.tools)
            payload["tool_choice"] = call.tool_choice
        response = await self.openai_client.responses.create(
            **payload, extra_body=cfg.extra_body or None, extra_headers=call.headers
        )
        output = [item.model_dump() for item in response.output]
        message = responses_output_to_message(output)
        usage = response.usage
        turn = Turn(
            finish_reason="tool_calls" if message.tool_calls else "stop",
            prompt_tokens=usage.input_tokens if usage else 0,
            completion_tokens=usage.output_tokens if usage else 0,
        )
        return message, turn

    async def _token_ids(
        self, call: _Call, kept: PolicyReply | None
    ) -> tuple[Message, Turn, str | None]:
        """Token-in, token-out: send kept ids + rendered new messages to /v1/completions, or,
        when the conversation shows images, to vLLM's token route with the images.

        With ``kept`` (stopped by the server at a weight update) the prompt is the kept
        call's prompt plus its completion ids, ``max_tokens`` what is left, and the answer
        is merged after the kept tokens: they are not sampled again, and the new weights
        prefill them. A constrained call (``tool_choice: required``, a grammar) cannot
        resume its constraint mid-way, and one with images is not continued on the token
        route: either is made again from its start.
        """
        images = [part for m in call.request.messages for part in m.images]
        constrained = bool(call.request.tools and call.tool_choice == "required")
        if kept is not None and kept.text is not None and not images and not constrained:
            return await self._continue(call, kept)
        openai_messages = [m.to_openai() for m in call.request.messages]
        last = call.request.history[-1] if call.request.history else None
        if last is not None and last.prompt_token_ids:
            # Only the messages after the last assistant turn are new (tool results).
            start = max(i for i, m in enumerate(call.request.messages) if m.role == "assistant") + 1
            delta = await self._renderer.delta(
                openai_messages[start:], call.request.tools, last.completion_token_ids
            )
            sent = last._sent_prompt_ids
            prompt_ids = (sent if sent is not None else last.prompt_token_ids) + (
                last.completion_token_ids + delta
            )
        else:
            prompt_ids = await self._renderer.prompt(openai_messages, call.request.tools)
        if images:
            return (*await self._generate(call, prompt_ids, images), None)
        return await self._completions(call, prompt_ids)

    async def _continue(self, call: _Call, kept: PolicyReply) -> tuple[Message, Turn, str]:
        """``kept``'s call on from its prompt + kept ids; the answer merged after them."""
        before = kept.turn
        sampling = self._sampling(call.request.sampling)
        if sampling.get("max_tokens") is not None:
            left = sampling["max_tokens"] - len(before.completion_token_ids)
            if left <= 0:  # stopped on its last token: done
                before.finish_reason = "length"
                return kept.message, before, kept.text or ""
            limit = {"max_tokens": left}
            sampling_left = (
                call.request.sampling.model_copy(update=limit)
                if call.request.sampling
                else SamplingParams(**limit)
            )
            call = dataclasses.replace(
                call, request=dataclasses.replace(call.request, sampling=sampling_left)
            )
        prompt = before.prompt_token_ids + before.completion_token_ids
        _, turn, text = await self._completions(call, prompt)
        text = (kept.text or "") + text
        content, calls = self._split_text(text, call)
        turn.prompt_token_ids = before.prompt_token_ids
        turn.completion_token_ids = before.completion_token_ids + turn.completion_token_ids
        turn.logprobs = before.logprobs + turn.logprobs
        turn.prompt_tokens = before.prompt_tokens
        turn.completion_tokens += before.completion_tokens
        turn.finish_reason = _finish(turn.finish_reason, calls)
        return Message(role="assistant", content=content, tool_calls=calls or None), turn, text

    async def _completions(self, call: _Call, prompt_ids: list[int]) -> tuple[Message, Turn, str]:
        """``prompt_ids`` to ``/v1/completions``; the message, the turn and the raw text."""
        cfg = self.config
        body: dict[str, Any] = {
            "model": cfg.model,
            "prompt": prompt_ids,
            **self._sampling(call.request.sampling),
            **cfg.extra_body,
            "logprobs": 0,  # the sampled token's own logprob
            "return_token_ids": True,
        }
        body.pop("chat_template_kwargs", None)  # used for rendering, not by /completions
        if call.request.tools and call.tool_choice == "required":
            body["response_format"] = tool_call_structural_tag(call.request.tools)
        answer = await self.http.post("/completions", body, call.headers, call.failed)
        choice, content, calls = self._text_choice(answer, call)
        text = choice.get("text") or ""
        usage = answer.get("usage") or {}
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        turn = Turn(
            # What the server says the model saw: a server that changed the ids (a BOS
            # added, say) shows up as a token mismatch of the episode.
            prompt_token_ids=choice.get("prompt_token_ids")
            or answer.get("prompt_token_ids")
            or prompt_ids,
            completion_token_ids=choice.get("token_ids") or [],
            logprobs=list(logprobs),
            finish_reason=_finish(choice.get("finish_reason"), calls),
            prompt_tokens=usage.get("prompt_tokens") or len(prompt_ids),
            completion_tokens=usage.get("completion_tokens") or 0,
        )
        message = Message(role="assistant", content=content, tool_calls=calls or None)
        return message, turn, text

    def _text_choice(
        self, answer: dict[str, Any], call: _Call
    ) -> tuple[dict[str, Any], str | None, list[ToolCall]]:
        """The first choice of a text answer (``/completions``, vLLM's generate route), its
        text split into content and Hermes tool calls when the call offered tools."""
        choices = answer.get("choices")
        if not choices:
            raise _UnusableAnswer(f"policy server {self.base_url} returned no choices")
        choice = choices[0]
        content, calls = self._split_text(choice.get("text") or "", call)
        return choice, content, calls

    @staticmethod
    def _split_text(text: str, call: _Call) -> tuple[str | None, list[ToolCall]]:
        """Content and Hermes tool calls of a completion's text, when the call offered tools."""
        if call.request.tools and call.tool_choice != "none":
            return parse_hermes_tool_calls(text)
        return text, []

    async def _generate(
        self, call: _Call, prompt_ids: list[int], images: list[ContentPart]
    ) -> tuple[Message, Turn]:
        """Token ids with images: vLLM's ``/inference/v1/generate`` (``token_route`` on a
        ``vllm`` deployment). ``prompt_ids`` hold one image token per image, as the chat
        template renders it, and every image of the conversation goes with them, in order:
        vLLM expands each into its placeholder tokens. The turn records the expanded ids
        (what the model saw, the sequence trained on) and keeps the sent ones, which the
        next call extends (sending expanded ids back would expand them again)."""
        cfg = self.config
        sampling: dict[str, Any] = {**self._sampling(call.request.sampling), **cfg.extra_body}
        sampling.pop("chat_template_kwargs", None)  # used for rendering, not by vLLM here
        sampling["logprobs"] = 0  # the sampled token's own logprob
        if call.request.tools and call.tool_choice == "required":
            tag = tool_call_structural_tag(call.request.tools)
            sampling["structured_outputs"] = {"structural_tag": json.dumps(tag)}
        body: dict[str, Any] = {
            "model": cfg.model,
            "token_ids": prompt_ids,
            "content_parts": [{"type": "image_url", "url": part.url} for part in images],
            "sampling_params": sampling,
            "return_token_ids": True,
            "output_mode": "text",
        }
        base = self.base_url.rstrip("/")
        if not base.endswith("/v1"):
            raise PolicyError(
                f"prompt_mode 'token_ids' with images posts to vLLM's {GENERATE_PATH}, "
                f"beside the OpenAI routes: the policy's base_url must end in /v1 (got {base})"
            )
        url = base.removesuffix("/v1") + GENERATE_PATH
        answer = await self.http.post(url, body, call.headers, call.failed)
        choice, content, calls = self._text_choice(answer, call)
        expanded = answer.get("prompt_token_ids")
        if not expanded:
            raise _UnusableAnswer(
                f"policy server {self.base_url} returned no prompt_token_ids from {GENERATE_PATH}"
            )
        completion = choice.get("token_ids") or []
        logprobs = (choice.get("logprobs") or {}).get("content") or []
        usage = answer.get("usage") or {}
        turn = Turn(
            prompt_token_ids=expanded,
            completion_token_ids=completion,
            logprobs=[entry["logprob"] for entry in logprobs],
            finish_reason=_finish(choice.get("finish_reason"), calls),
            prompt_tokens=usage.get("prompt_tokens") or len(expanded),
            completion_tokens=usage.get("completion_tokens") or len(completion),
        )
        turn._sent_prompt_ids = prompt_ids
        return Message(role="assistant", content=content, tool_calls=calls or None), turn

    @property
    def _renderer(self) -> DeltaRenderer:
        if self._delta_renderer is None:
            self._delta_renderer = self._load_renderer()
        return self._delta_renderer

    def _load_renderer(self) -> DeltaRenderer:
        kwargs = self.config.extra_body.get("chat_template_kwargs")
        tokenize = chat_template_tokenizer(self.config.tokenizer or self.config.model)
        return DeltaRenderer(tokenize, kwargs)


# vLLM's token-in route, next to the base URL's /v1 (rayrollout/deployments/vllm/token_route.py on a
# 'vllm' deployment; vLLM's own server with --enable-scale-out).
GENERATE_PATH = "/inference/v1/generate"
_RETRY_ERROR_CHARS = 120  # per failed try on a turn: enough to tell a 500 from a timeout


class _UnusableAnswer(PolicyError):
    """The server answered 200 with something that is not a completion (worth a retry)."""


def chat_reply(body: dict[str, Any], base_url: str) -> tuple[Message, Turn]:
    """The assistant message and turn record of a Chat Completions answer (plain JSON)."""
    choices = body.get("choices")
    if not choices:
        raise _UnusableAnswer(f"policy server {base_url} returned no choices")
    choice = choices[0]
    answer = choice["message"]
    calls = [
        ToolCall(
            id=c["id"],
            function=FunctionCall(
                name=c["function"]["name"], arguments=c["function"].get("arguments") or ""
            ),
        )
        for c in answer.get("tool_calls") or []
        if c.get("type", "function") == "function"
    ]
    message = Message(role="assistant", content=answer.get("content"), tool_calls=calls or None)
    logprobs = choice.get("logprobs") or {}
    usage = body.get("usage") or {}
    turn = Turn(
        prompt_token_ids=body.get("prompt_token_ids") or choice.get("prompt_token_ids") or [],
        completion_token_ids=choice.get("token_ids") or [],
        logprobs=[t["logprob"] for t in logprobs.get("content") or []],
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens") or 0,
        completion_tokens=usage.get("completion_tokens") or 0,
    )
    return message, turn


def _finish(reason: str | None, calls: list[ToolCall]) -> str | None:
    """The turn's finish reason: 'tool_calls' when the text holds calls, except for a call
    the server stopped ('abort'), which the gate continues."""
    return "tool_calls" if calls and reason != ABORTED else reason


def _brief(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
