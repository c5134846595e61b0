"""NeMo Gym config for a rayrollout environment, so NeMo Gym's own agents use it unchanged.

NeMo Gym 0.7.0 knows a resources server only as a config block whose ``entrypoint`` its
``ng_run`` starts from a folder ``resources_servers/<name>/`` under one of its search roots
(``NEMO_GYM_EXTRA_ROOTS``, the working directory, its install). rayrollout ships such a
folder (``server/resources_servers/rayrollout_env``, whose ``app.py`` runs
``rayrollout env serve``), so the user writes no placeholder: they add
``nemo_gym_root()`` to ``NEMO_GYM_EXTRA_ROOTS`` and paste the block
``resources_server_block`` makes (``rayrollout env nemo-gym-config`` prints both).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["SERVER_FOLDER", "nemo_gym_root", "resources_server_block", "simple_agent_block"]

SERVER_FOLDER = "rayrollout_env"  # the folder name ng_run resolves under resources_servers/


def nemo_gym_root() -> Path:
    """The folder to add to ``NEMO_GYM_EXTRA_ROOTS`` (it holds ``resources_servers/``)."""
    return Path(__file__).resolve().parent / "server"


def _rayrollout_executable() -> str:
    """The ``rayrollout`` command of this install (ng_run's PATH starts with NeMo Gym's venv)."""
    beside = Path(sys.executable).with_name("rayrollout")
    return str(beside) if beside.exists() else (shutil.which("rayrollout") or "rayrollout")


def resources_server_block(
    server_name: str,
    environment: str,
    host: str = "127.0.0.1",
    port: int = 8123,
    serve_args: list[str] | None = None,
) -> dict[str, Any]:
    """A top-level NeMo Gym config entry ``server_name`` serving ``environment``."""
    block: dict[str, Any] = {
        "entrypoint": "app.py",
        "environment": environment,
        "host": host,
        "port": port,
        "rayrollout": _rayrollout_executable(),
        "domain": "agent",
        "verified": False,
        "description": f"rayrollout environment '{environment}' (rayrollout env serve)",
    }
    if serve_args:
        block["serve_args"] = list(serve_args)
    return {server_name: {"resources_servers": {SERVER_FOLDER: block}}}


def simple_agent_block(
    agent_name: str, resources_server: str, model_server: str = "policy_model"
) -> dict[str, Any]:
    """NeMo Gym's ``simple_agent`` playing episodes against ``resources_server``, and the
    ``legacy_agent`` environment server through which 0.7.0's rollout collection reaches it
    (``<agent_name>_environment_server``; 0.7.0 warns when it has to invent one)."""
    return {
        agent_name: {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": resources_server},
                    "model_server": {"type": "responses_api_models", "name": model_server},
                }
            }
        },
        f"{agent_name}_environment_server": {
            "environment_servers": {
                "legacy_agent": {
                    "entrypoint": "app.py",
                    "agent_server": {"type": "responses_api_agents", "name": agent_name},
                }
            }
        },
    }
