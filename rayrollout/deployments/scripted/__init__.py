"""The scripted policy: a stand-in for the LLM's judgement that speaks the real OpenAI protocol.

Its policy kind is ``kind.SCRIPTED``. The Serve deployment (``app``) loads on first use
of its names, not with the package: looking the kind up by name (the checks before Ray
starts) or the in-process policy (``local``) never imports Ray Serve.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayrollout.deployments.scripted.app import ScriptedPolicy, scripted_policy_app

__all__ = ["ScriptedPolicy", "scripted_policy_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.app"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
