"""The scripted policy in this process, without Ray: what ``rayrollout agent test`` plays an
agent against when no server is named (the kind's ``local`` form, ``kind.SCRIPTED``).

The same moves as the Serve app (``strategy.next_action``) answered as the same Chat
Completions shape (``server.chat_completion``), read back by the policy client's own parser,
so an agent sees exactly what it would see from the deployed scripted policy.
"""

from __future__ import annotations

import itertools
import time

from rayrollout.data.config import PolicyConfig
from rayrollout.deployments.scripted.strategy import next_action
from rayrollout.policy.call import PolicyReply, PolicyRequest
from rayrollout.policy.client import chat_reply

__all__ = ["LocalScriptedPolicy"]


class LocalScriptedPolicy:
    """A ``rayrollout.policy.protocol.Policy`` that answers with the scripted strategy."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._ids = itertools.count()

    async def complete(self, request: PolicyRequest) -> PolicyReply:
        from rayrollout.deployments.scripted.protocol import chat_completion

        started = time.time()
        sent = [m.to_openai() for m in request.messages]
        action = next_action(sent, request.tools)
        words = sum(len(str(m.get("content") or "").split()) for m in sent)
        answer = chat_completion(action, next(self._ids), self.config.model, words, 1)
        message, turn = chat_reply(answer, "scripted (in process)")
        turn.started_at, turn.seconds = started, time.time() - started
        return PolicyReply(message, turn)

    async def close(self) -> None:
        return None
