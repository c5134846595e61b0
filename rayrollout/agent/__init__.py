"""Agents: the contract of an episode's loop, and what records every model call it makes.

Lives here: the contract (``contract``: ``Agent``, ``EpisodeEnd``, ``OutOfTurns``), the
episode as an agent sees it and the recorder of its turns (``episode``: ``AgentEpisode``),
the registry of agents by name (``registry``) and the recording OpenAI-compatible gateway
for programs that call the model themselves (``gateway``). The agents themselves are
plugins (``rayrollout.agents``: the repo's ``agents/`` folder).

May import: ``rayrollout.data``, ``rayrollout.environment``, ``rayrollout.policy`` and
``rayrollout.errors``; never the engine, the API or the CLI.
"""

from rayrollout.agent.contract import Agent, EpisodeEnd, OutOfTurns
from rayrollout.agent.episode import POLICY, AgentEpisode

__all__ = ["POLICY", "Agent", "AgentEpisode", "EpisodeEnd", "OutOfTurns"]
