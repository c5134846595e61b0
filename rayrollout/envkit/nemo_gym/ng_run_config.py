"""NeMo Gym config for a rayrollout environment, so NeMo Gym's own agents use it unchanged.

``ng_run`` starts a resources server only from a folder under its search roots, so
rayrollout ships one (``nemo_gym_root()``) and writes its block (``resources_server_block``);
``service_agent_block`` does the same for the relay of ``/run`` to the rollout service.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "AGENT_FOLDER",
    "SERVER_FOLDER",
    "nemo_gym_root",
    "resources_server_block",
    "service_agent_block",
    "simple_agent_block",
]

SERVER_FOLDER = "rayrollout_env"  # the folder name ng_run resolves under resources_servers/
AGENT_FOLDER = "rayrollout_service"  # ... and under responses_api_agents/


def nemo_gym_root() -> Path:
    """The folder to add to ``NEMO_GYM_EXTRA_ROOTS`` (it holds ``resources_servers/`` and
    ``responses_api_agents/``)."""
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


def service_agent_block(
    agent_name: str,
    url: str,
    token_file: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> dict[str, Any]:
    """NeMo Gym agent server ``agent_name`` relaying to the rollout service at ``url``, and the
    ``legacy_agent`` environment server through which 0.7.0's ``ng_collect_rollouts`` reaches
    it (``<agent_name>_environment_server``).

    Args:
        agent_name: The name NeMo Gym knows the agent by (``+agent_name=`` of the collector).
        url: The rollout service's URL (``rayrollout status`` prints it).
        token_file: The file holding the service's token; None where the service serves
            ``/run`` without one (``service.nemo_gym_run_without_token``).
        host: Where NeMo Gym reaches the relay.
        port: The relay's port; None lets ng_run pick a free one.
    """
    block: dict[str, Any] = {
        "entrypoint": "app.py",
        "url": url,
        "host": host,
        "description": f"rayrollout's rollout service at {url} (POST /run)",
    }
    if token_file is not None:
        block["token_file"] = token_file
    if port is not None:
        block["port"] = port
    return {
        agent_name: {"responses_api_agents": {AGENT_FOLDER: block}},
        f"{agent_name}_environment_server": {
            "environment_servers": {
                "legacy_agent": {
                    "entrypoint": "app.py",
                    "agent_server": {"type": "responses_api_agents", "name": agent_name},
                }
            }
        },
    }
