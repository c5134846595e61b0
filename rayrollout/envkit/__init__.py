"""Environments: the contract an environment implements (``contract``, re-exported here),
and everything that hosts one: registry, sessions, Serve replicas, NeMo Gym's protocol.

May import: ``rayrollout.data`` and ``rayrollout.errors``; never the policy, the engine, the
API or the CLI.
"""

from rayrollout.envkit.contract import (
    Environment,
    Episode,
    ToolError,
    ToolResult,
    Verification,
    tool,
)

__all__ = ["Environment", "Episode", "ToolError", "ToolResult", "Verification", "tool"]
