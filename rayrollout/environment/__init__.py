"""Environments: the contract an environment implements, and everything that hosts one.

Lives here: the contract (``contract``: ``Environment``, ``@tool``, ``ToolError``,
``Verification``, ``Episode``, re-exported below so an environment file imports
``rayrollout.environment``), the one checker of a model's tool calls (``tool_args``), the
registry of environment specs, one name each (``registry``), the ``EnvSession`` contract and
its inline and Serve clients (``sessions``), the Serve replicas behind them (``server``,
``session_store``, ``serve_batching``), NeMo Gym's resources-server protocol as client and
as server (``nemo_gym``), and ``env test`` (``testing``).

May import: ``rayrollout.data`` and ``rayrollout.errors``; never the policy, the engine, the
API or the CLI.
"""

from rayrollout.environment.contract import (
    Environment,
    Episode,
    ToolError,
    ToolResult,
    Verification,
    tool,
)

__all__ = ["Environment", "Episode", "ToolError", "ToolResult", "Verification", "tool"]
