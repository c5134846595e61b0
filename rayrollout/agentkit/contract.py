"""What an agent implements: play one episode its own way.

An agent is the loop of an episode: which messages go to the model, when tools run, when
the episode is over. The engine keeps everything around it (scheduling, retries of lost
environments, pauses and policy versions, faults, writing), and the ``AgentEpisode`` an
agent is handed records every model call token-exact, whatever the agent does with the
history. An agent is one short class::

    from rayrollout.agentkit import Agent, AgentEpisode

    class OneShot(Agent):
        "Ask once, no tools."

        async def play(self, episode: AgentEpisode) -> None:
            episode.messages.append(await episode.model(episode.messages, tools=[]))

or an async function ``async def play(episode: AgentEpisode) -> None`` registered the same
way. ``play`` returns None (the engine then asks the environment's verifier about
``episode.messages``) or a ``Verification`` it got itself (an agent server that scores its
own episodes). Ending early with a status: raise ``EpisodeEnd``.

One instance per worker actor plays many episodes at once, so per-episode state lives in
``play``'s locals (or ``episode.state``), never on ``self``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

from rayrollout.data.schema import Status
from rayrollout.envkit.contract import Verification

if TYPE_CHECKING:
    from rayrollout.agentkit.episode import AgentEpisode

__all__ = ["Agent", "AgentFunction", "EpisodeEnd", "FunctionAgent", "OutOfTurns"]


class EpisodeEnd(Exception):  # noqa: N818 (a signal, not an error of the agent)
    """Ends the episode now with ``status`` and ``error`` (no verifier runs).

    The episode context raises it for what an agent cannot go on from (the policy failed
    for good, a tool timed out, the environment broke); an agent may raise it too.
    """

    def __init__(self, status: Status, error: str) -> None:
        super().__init__(error)
        self.status: Status = status
        self.error = error


class OutOfTurns(Exception):  # noqa: N818
    """Raised by ``AgentEpisode.model`` when the episode has used ``max_turns`` model calls.

    The engine ends the episode as ``max_turns`` and still asks the verifier, as for an
    episode whose model never gave a final answer.
    """


class Agent:
    """Base of an agent: subclass it and implement ``play``.

    ``__init__`` takes the keyword arguments of ``agent_settings.NAME.args`` in the run's
    config (none by default).
    """

    name: ClassVar[str] = ""  # a label; the registered name is the one tasks use

    async def play(self, episode: AgentEpisode) -> Verification | None:
        """Play one episode; return None to have the environment verify ``episode.messages``."""
        raise NotImplementedError(f"{type(self).__name__} must implement play(episode)")


AgentFunction = Callable[..., Awaitable[Verification | None]]
"""``async def play(episode, **args)``: an agent as one function (``args`` from the config)."""


class FunctionAgent(Agent):
    """An agent written as one async function ``play(episode, **args)``."""

    def __init__(self, play: AgentFunction, **args: Any) -> None:
        self._play = play
        self._args = args
        self.name = getattr(play, "__name__", "")  # type: ignore[misc]

    async def play(self, episode: AgentEpisode) -> Verification | None:
        return await self._play(episode, **self._args)
