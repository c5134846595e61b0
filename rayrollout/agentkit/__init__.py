"""Agents: the contract of an episode's loop (``contract``), the episode that records every
model call (``episode``), the registry by name (``registry``) and the recording gateway for
programs that call the model themselves (``gateway``). The agents are plugins.

May import: ``rayrollout.data``, ``rayrollout.envkit``, ``rayrollout.policy`` and
``rayrollout.errors``; never the engine, the API or the CLI.
"""

from rayrollout.agentkit.contract import Agent, EpisodeEnd, OutOfTurns
from rayrollout.agentkit.episode import POLICY, AgentEpisode

__all__ = ["POLICY", "Agent", "AgentEpisode", "EpisodeEnd", "OutOfTurns"]
