"""``AgentEpisode``: what an agent is handed, and the recorder of everything it does.

Every model call goes through ``model`` and becomes a ``Turn`` (token ids, logprobs, policy
version); a call that *extends* the speaker's previous one continues its token sequence, any
other starts a new one. Tools go through ``call_tool`` / ``run_tools``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rayrollout.agentkit.contract import EpisodeEnd, OutOfTurns
from rayrollout.data.config import EpisodeConfig
from rayrollout.data.schema import (
    EpisodeMetrics,
    Message,
    SamplingParams,
    Task,
    TimelineEvent,
    Trajectory,
    Turn,
)
from rayrollout.envkit import Episode, ToolResult, Verification
from rayrollout.envkit.sessions import EnvironmentSetupFailed, EnvSession
from rayrollout.policy.call import PolicyRequest
from rayrollout.policy.client import PolicyError, PolicyTimeout
from rayrollout.policy.protocol import Policy
from rayrollout.policy.tokens import first_mismatch

if TYPE_CHECKING:
    from rayrollout.agentkit.gateway import GatewayEndpoint

__all__ = ["AgentEpisode", "GatewayOpener", "POLICY"]

POLICY = "policy"
"""The speaker of the turns a trainer learns from."""


class GatewayOpener(Protocol):
    """Opens the recording OpenAI-compatible gateway for one episode (``agent.gateway``)."""

    def open(self, episode: AgentEpisode) -> Any:  # an async context manager
        ...


@dataclass
class _Sequence:
    """The last call of one speaker: what it sent, what came back, the turns of its sequence."""

    sent: list[Message]
    reply: Message
    turns: list[Turn] = field(default_factory=list)


class AgentEpisode:
    """One episode as an agent sees it: the task, the transcript, the model, the tools.

    Attributes an agent reads or changes:
        task: the task (prompt, verifier fields, its environment's name).
        tools: the tool schemas offered (the task's, else the environment's).
        messages: the transcript, starting as the task's prompt; what the verifier reads.
            Append to it; an agent that shows the model something else passes that to
            ``model`` and keeps the transcript whole.
        state: free per-episode storage for the agent.
        episode_id: unique per attempt (the session key of the environment and policy).
        limits: the run's ``episode`` settings (``max_turns``, timeouts).
    """

    def __init__(
        self,
        task: Task,
        tools: list[dict[str, Any]],
        session: EnvSession,
        policy: Policy,
        limits: EpisodeConfig,
        trajectory: Trajectory,
        episode_id: str,
        gateway: GatewayOpener | None = None,
    ) -> None:
        self.task = task
        self.tools = tools
        self.messages: list[Message] = list(task.prompt)
        self.state: dict[str, Any] = {}
        self.episode_id = episode_id
        self.limits = limits
        self.session = session
        self.policy = policy
        self.trajectory = trajectory
        self._gateway = gateway
        self._sequences: dict[str, _Sequence] = {}
        self._policy_turns = 0

    # ---------------------------------------------------------------- the model

    @property
    def turns_left(self) -> int:
        """Policy model calls this episode may still make (``max_turns`` minus those made)."""
        return self.limits.max_turns - self._policy_turns

    async def model(
        self,
        messages: list[Message] | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
        speaker: str = POLICY,
    ) -> Message:
        """One model call; returns the assistant message (not appended: the agent decides).

        ``messages`` defaults to the transcript, ``tools`` to the episode's. ``speaker``
        names the role the model plays: turns of ``"policy"`` count against ``max_turns``
        (one call past it raises ``OutOfTurns``) and are the ones trained on; another
        speaker (a simulated user) keeps its own token sequence.
        Raises ``EpisodeEnd`` when the policy failed for good (after its retries).
        """
        if speaker == POLICY:
            if self.turns_left <= 0:
                raise OutOfTurns(f"the episode used its {self.limits.max_turns} model calls")
            self._policy_turns += 1
        sent = self.messages if messages is None else messages
        if not sent:
            # A task opened by its server (``opening: seed_session``) has no prompt until the
            # environment's reset hands over the first observation.
            hint = (
                ": its first observation comes from the server's /seed_session, which the "
                "reset_step agent puts into the conversation (--agent reset_step)"
                if self.task.opening == "seed_session"
                else ""
            )
            raise EpisodeEnd("error", f"the model was called with no messages{hint}")
        offered = self.tools if tools is None else tools
        previous = self._sequences.get(speaker)
        extends = previous is not None and _extends(previous, sent)
        history = previous.turns if extends and previous is not None else []
        try:
            reply = await self.policy.complete(
                PolicyRequest(
                    sent,
                    offered,
                    sampling if sampling is not None else self.task.sampling,
                    session_id=self.episode_id,
                    history=history,
                    last_turn=speaker == POLICY and self.turns_left == 0,
                )
            )
        except PolicyTimeout as exc:
            raise EpisodeEnd("timeout", str(exc)) from None
        except PolicyError as exc:
            raise EpisodeEnd("error", str(exc)) from None
        turn = reply.turn
        turn.speaker = speaker
        turn.extends_previous = extends
        if _is_prefix(sent, self.messages):
            turn.prompt_message_count = len(sent)
        else:
            turn.sent_messages = list(sent)
        if extends and history:
            _check_tokens(self.trajectory.metrics, history[-1], turn, len(self.trajectory.turns))
        self.trajectory.turns.append(turn)
        self._sequences[speaker] = _Sequence(list(sent), reply.message, [*history, turn])
        metrics = self.trajectory.metrics
        _mark(metrics, "model", "" if speaker == POLICY else speaker, turn.started_at, turn.seconds)
        metrics.seconds_model += turn.seconds  # the episode's time, whoever the model played
        if speaker == POLICY:  # turns and tokens are the policy's: what is trained on
            metrics.turns += 1
            metrics.tokens_in += turn.prompt_tokens
            metrics.tokens_out += turn.completion_tokens
            metrics.turns_across_updates += len(set(turn.token_versions)) > 1
        return reply.message

    # ---------------------------------------------------------------- tools

    async def call_tool(self, name: str, arguments: str) -> ToolResult:
        """Run one tool of the environment (the model's mistakes come back as error results).

        Raises ``EpisodeEnd``: ``timeout`` past ``tool_timeout_s``, ``error`` when the tool
        itself broke (an environment bug, not the model's mistake).
        """
        metrics = self.trajectory.metrics
        started = time.perf_counter()
        started_at = time.time()
        try:
            async with asyncio.timeout(self.limits.tool_timeout_s):  # no task per call
                result = await self.session.call_tool(name, arguments)
        except TimeoutError:
            raise EpisodeEnd(
                "timeout", f"tool '{name}' did not answer within {self.limits.tool_timeout_s}s"
            ) from None
        except EnvironmentSetupFailed as exc:  # a Serve session opens with its first call
            raise EpisodeEnd("error", f"setting up the environment failed: {exc}") from None
        except Exception as exc:
            raise EpisodeEnd(
                "error", f"tool '{name}' failed: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            metrics.seconds_tools += time.perf_counter() - started
        _mark(metrics, "tool", name, started_at, time.time() - started_at, ok=not result.is_error)
        metrics.tool_calls += 1
        metrics.tool_errors += result.is_error
        if name not in metrics.tools_used:
            metrics.tools_used.append(name)
        return result

    async def run_tools(self, reply: Message) -> list[Message]:
        """Run every tool call of an assistant message in order; append the tool messages to
        the transcript and return them."""
        answers = []
        for call in reply.tool_calls or []:
            result = await self.call_tool(call.function.name, call.function.arguments)
            answer = Message(
                role="tool",
                tool_call_id=call.id,
                name=call.function.name,
                content=result.content,
                parts=result.parts,
            )
            self.messages.append(answer)
            answers.append(answer)
        return answers

    # ---------------------------------------------------------------- the verdict

    async def verify(self, messages: list[Message] | None = None) -> Verification:
        """Ask the environment's verifier about ``messages`` (default: the transcript).

        The engine calls it after ``play`` returns None; an agent may call it itself and
        return the verdict. Raises ``EpisodeEnd`` on a verifier failure or timeout.
        """
        metrics = self.trajectory.metrics
        started = time.perf_counter()
        started_at = time.time()
        episode = Episode(task=self.task, messages=self.messages if messages is None else messages)
        try:
            async with asyncio.timeout(self.limits.verify_timeout_s):
                verdict = await self.session.verify(episode)
        except TimeoutError:
            raise EpisodeEnd(
                "timeout", f"verifier did not answer within {self.limits.verify_timeout_s}s"
            ) from None
        except EnvironmentSetupFailed as exc:
            raise EpisodeEnd("error", f"setting up the environment failed: {exc}") from None
        except Exception as exc:
            raise EpisodeEnd("error", f"verifier failed: {type(exc).__name__}: {exc}") from None
        finally:
            metrics.seconds_verify = time.perf_counter() - started
        _mark(metrics, "verify", "", started_at, metrics.seconds_verify)
        return verdict

    # ---------------------------------------------------------------- programs

    @asynccontextmanager
    async def gateway(self) -> AsyncIterator[GatewayEndpoint]:
        """This episode's recording OpenAI-compatible endpoint, for a program that calls the
        model itself (an OpenAI SDK script, a NeMo Gym agent): every call it makes through
        the endpoint goes through ``model`` and is recorded. Closed when the block ends."""
        if self._gateway is None:
            raise RuntimeError("this worker actor has no gateway (rayrollout.agentkit.gateway)")
        async with self._gateway.open(self) as endpoint:
            yield endpoint


def _same(a: Message, b: Message) -> bool:
    return a is b or a == b


def _is_prefix(sent: list[Message], transcript: list[Message]) -> bool:
    """Whether ``sent`` is the transcript's first messages (the same objects, or equal)."""
    if sent is transcript:
        return True
    if len(sent) > len(transcript):
        return False
    return all(_same(a, b) for a, b in zip(sent, transcript, strict=False))


def _extends(previous: _Sequence, sent: list[Message]) -> bool:
    """Whether ``sent`` is the previous call's messages, then its reply, then anything."""
    n = len(previous.sent)
    if len(sent) <= n or not _same(sent[n], previous.reply):
        return False
    return all(_same(a, b) for a, b in zip(previous.sent, sent, strict=False))


def _mark(
    metrics: EpisodeMetrics,
    kind: Literal["model", "tool", "verify"],
    name: str,
    started_at: float,
    seconds: float,
    ok: bool = True,
) -> None:
    """Add a step to the episode's timeline (offsets from the episode's start)."""
    metrics.timeline.append(
        TimelineEvent(
            kind=kind, name=name, start_s=started_at - metrics.started_at, seconds=seconds, ok=ok
        )
    )


def _check_tokens(metrics: EpisodeMetrics, previous: Turn, turn: Turn, index: int) -> None:
    """Record whether an extending turn's prompt ids extend the previous prompt + completion."""
    if not turn.prompt_token_ids or not previous.prompt_token_ids:
        return
    at = first_mismatch(
        previous.prompt_token_ids + previous.completion_token_ids, turn.prompt_token_ids
    )
    if at is None:
        return
    turn.token_mismatch_index = at
    metrics.token_mismatches += 1
    if metrics.token_mismatch_turn is None:
        metrics.token_mismatch_turn, metrics.token_mismatch_index = index, at
