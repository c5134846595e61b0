"""The ``verifiers`` environment name: rows whose episode a verifiers environment plays.

A verifiers (Prime Intellect) environment is its own loop and its own judge, so it is run by
the ``verifiers`` agent (``rayrollout/agents/verifiers.py``: the environment's ``rollout``
against the
episode's recording gateway, its rubric's score as the reward), this class's
``default_agent``: a row naming the environment needs no ``agent``. This class gives such
rows an environment to name and ``rayrollout env list`` a line for the source. It offers no tools.
Its verifier, asked only when the agent did not give the verdict itself (an episode that ran
out of ``max_turns``, or a row played by another agent), scores the transcript with the same
environment's rubric: the task's prompt as verifiers' ``prompt``, the rest as ``completion``.

Loading (``load_verifiers_environment``, shared with the agent) works around one thing a
verifiers environment assumes about its process: that it may install SIGINT and SIGTERM
handlers (off the main thread that fails, and in a worker the signals are Ray's).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import types
from typing import Any

from rayrollout.envkit.contract import Environment, Episode, Verification

__all__ = ["VerifiersEnvironment", "load_verifiers_environment"]

_LOADED: dict[str, Any] = {}  # per process: the verifier's environments, loaded once


class VerifiersEnvironment(Environment):
    """A verifiers environment, played by the ``verifiers`` agent (row field ``vf_env``)."""

    name = "verifiers"
    source = "verifiers"
    default_agent = "verifiers"  # the environment plays its own rollout

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("verifiers") is None:
            return (
                "verifiers is not installed: pip install 'rayrollout[verifiers]' into a venv of "
                "its own (python3 -m venv .venv-verifiers && .venv-verifiers/bin/pip install "
                "'rayrollout[verifiers]'): its pins hold websockets below 17, under the openenv "
                "extra's"
            )
        return None

    async def verify(self, episode: Episode) -> Verification:
        fields = self.task.fields
        env_id, env_args = fields.get("vf_env"), fields.get("vf_env_args") or {}
        if not isinstance(env_id, str) or not env_id or not isinstance(env_args, dict):
            raise ValueError(
                f"environment 'verifiers': task {self.task.task_id} needs 'vf_env' (a verifiers "
                "environment id) and, if any, 'vf_env_args' (an object) to be scored; play it "
                "with the 'verifiers' agent"
            )
        key = f"{env_id} {json.dumps(env_args, sort_keys=True, default=str)}"
        if key not in _LOADED:
            _LOADED[key] = await asyncio.to_thread(load_verifiers_environment, env_id, env_args)
        messages = [message.to_openai() for message in episode.messages]
        opening = len(self.task.prompt)
        state: dict[str, Any] = {
            "prompt": messages[:opening],
            "completion": messages[opening:],
            "answer": fields.get("answer", ""),
            "info": fields.get("info") or {},
            "trajectory": [],
        }
        await _LOADED[key].rubric.score_rollout(state)
        metrics = dict(state.get("metrics") or {})
        return Verification(reward=float(state["reward"]), details={"metrics": metrics})


def load_verifiers_environment(env_id: str, env_args: dict[str, Any]) -> Any:
    """``verifiers.load_environment(env_id, **env_args)``, built without taking the process's
    signals (``_KEEP_SIGNALS``)."""
    import verifiers as vf
    import verifiers.envs.environment as vf_environment

    vf_environment.signal = _KEEP_SIGNALS
    return vf.load_environment(env_id, **env_args)


# verifiers' Environment installs SIGINT and SIGTERM handlers when it is built: that fails off
# the main thread (an actor's event loop, a loader thread) and would take the worker's signals
# from Ray. Its module gets a copy of ``signal`` whose ``signal()`` installs nothing.
_KEEP_SIGNALS = types.SimpleNamespace(**vars(signal))
_KEEP_SIGNALS.signal = lambda signalnum, handler: None
