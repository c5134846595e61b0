"""The built-in agent: model -> tool calls -> model -> ... until the model answers.

Each turn sends the whole transcript, so every turn extends the one before (one token
sequence per episode). The model's mistakes (an unknown tool, arguments that are not JSON)
come back to it as tool messages; a tool that breaks, or a turn past ``max_turns``, ends the
episode (``error``, ``max_turns``).
"""

from __future__ import annotations

from rayrollout.agentkit import Agent, AgentEpisode


class ToolLoop(Agent):
    """Call the model, run its tool calls, repeat until it answers without one."""

    async def play(self, episode: AgentEpisode) -> None:
        while True:
            reply = await episode.model()  # raises OutOfTurns past max_turns
            episode.messages.append(reply)
            if not reply.tool_calls:
                return
            await episode.run_tools(reply)
