"""The demo's task file (the example tasks of every built-in environment this machine can
run) and its defaults.

An environment that cannot run here (``Environment.unavailable_reason``) is left out and the
command says why, so a newcomer's first demo ends with every episode ``ok``.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayrollout.envkit.registry import available_environments

if TYPE_CHECKING:
    from rayrollout.data.config import RunConfig

__all__ = ["demo_defaults", "write_demo_tasks"]


def demo_defaults(config: RunConfig) -> dict[str, Any]:
    """The settings the demo adds where ``config`` names none, as config overrides.

    Its first episode comes sooner with one worker (its few hundred scripted episodes play
    as fast as on two) and, on a Ray of its own, the scripted policy in one plain actor
    (Serve's three processes, started one after another, are seconds on a laptop). On a
    cluster (``ray.address``, ``RAY_ADDRESS``) the policy stays on Serve, whose proxy every
    node runs: the actor listens on the driver's node only.
    """
    defaults: dict[str, Any] = {}
    if "num_workers" not in config.workers.model_fields_set:
        defaults["workers"] = {"num_workers": 1}
    on_cluster = config.ray.address or os.environ.get("RAY_ADDRESS")
    scripted = config.policy.settings.get("scripted") or {}  # the scripted kind's, as given
    if config.policy.kind == "scripted" and "hosting" not in scripted and not on_cluster:
        defaults["policy"] = {"scripted": {"hosting": "actor"}}
    return defaults


def write_demo_tasks(path: Path, config: RunConfig) -> dict[str, str]:
    """Write the ``tasks.jsonl`` of every registered environment this machine can run into
    one file at ``path``; return the environments left out, each with its reason (a line
    naming the fix).

    Raises:
        FileNotFoundError: no environment that can run here ships example tasks.
    """
    from rayrollout.api.preflight import environment_unavailable

    lines: list[str] = []
    left_out: dict[str, str] = {}
    for name, target in sorted(available_environments().items()):
        package = importlib.import_module(target.partition(":")[0].rpartition(".")[0])
        example = Path(package.__file__ or "").parent / "tasks.jsonl"
        if not example.exists():
            continue
        module, _, attribute = target.partition(":")
        if getattr(importlib.import_module(module), attribute).needs_vision:
            left_out[name] = (
                "its tasks need a model that sees images (the demo's scripted policy does "
                "not); run them with a vision-language policy (docs/how-to/vision-policy.md)"
            )
            continue
        reason = environment_unavailable(name, config)
        if reason is not None:
            left_out[name] = reason
            continue
        lines += [line for line in example.read_text().splitlines() if line.strip()]
    if not lines:
        raise FileNotFoundError(
            "no environment this machine can run ships example tasks (tasks.jsonl)"
            + "".join(f"; {name}: {reason}" for name, reason in left_out.items())
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return left_out
