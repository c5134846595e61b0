"""The verifiers agent: a verifiers environment plays its own rollout, every model call recorded.

A verifiers (Prime Intellect) environment owns its episode loop: ``env.rollout(input, client,
model, sampling_args)`` sends the prompt, runs its tools, decides when to stop, and its
``Rubric`` scores the result. Rewriting that loop as a rayrollout agent would change what the
environment means; instead the environment runs unchanged with an ``openai.AsyncOpenAI``
client whose base URL is the episode's recording gateway (``rayrollout.agentkit.gateway``), so
every model call it makes is a recorded policy turn with the policy's token ids. The
episode's reward is its rubric's score (any finite float), its metrics go to the row's
``verification`` details.

The classic API is the one supported: ``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv`` and
their rubrics, as verifiers 0.2.x ships them (0.4.0 ships only ``verifiers.v1``, whose
harness runs in a separate runtime). Its pins clash with the ``openenv`` extra
(``websockets``), so it gets a virtual environment of its own (``.ci/verifiers`` builds one).

A row (the environment is loaded with ``verifiers.load_environment(vf_env, **vf_env_args)``,
an installed environment package or an importable module with ``load_environment``; loaded
once per worker actor and kept)::

    {"prompt": [{"role": "user", "content": "What is 6 times 7?"}],
     "environment": "verifiers", "agent": "verifiers",
     "vf_env": "my_tool_env", "vf_env_args": {}, "answer": "42", "info": {}}

``answer`` and ``info`` are handed to the rollout as verifiers' own input fields. The prompt
is the row's ``prompt``; the model and sampling are the run's.

Ends: a rollout that records an error (the environment's, or a model call that failed) is an
``error`` episode naming it; one verifiers cut short itself (its own ``max_turns``, an
overlong prompt) is ``ok`` with the rubric's score and ``is_truncated`` in the details; an
environment that cannot be loaded, or verifiers not installed, is ``error`` saying so; a
model call that ran into the episode's own end (rayrollout's ``max_turns``, the policy
failing for good) ends it with that status, and at ``max_turns`` the ``verifiers``
environment's verifier scores the transcript with the same rubric.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
from typing import Any, ClassVar

from rayrollout.agentkit import Agent, AgentEpisode, EpisodeEnd
from rayrollout.envkit import Verification
from rayrollout.envkit.verifiers import load_verifiers_environment

__all__ = ["VerifiersAgent"]

_NAME = "verifiers"


class VerifiersAgent(Agent):
    """Run a verifiers environment's own rollout against the episode's recording gateway."""

    name: ClassVar[str] = _NAME

    def __init__(self, vf_env: str | None = None, vf_env_args: dict[str, Any] | None = None):
        """
        Args:
            vf_env: The environment id for rows without a ``vf_env`` field.
            vf_env_args: ``load_environment`` keyword arguments for rows without their own.
        """
        self.vf_env = vf_env
        self.vf_env_args = dict(vf_env_args or {})
        self._loaded: dict[str, Any] = {}  # per actor: environments are loaded once

    async def play(self, episode: AgentEpisode) -> Verification:
        fields = episode.task.fields
        env_id = fields.get("vf_env") or self.vf_env
        if not env_id or not isinstance(env_id, str):
            raise EpisodeEnd(
                "error",
                f"agent '{_NAME}': task {episode.task.task_id} names no verifiers environment; "
                "give the row a 'vf_env' field or set agent_settings.verifiers.args.vf_env",
            )
        env_args = fields.get("vf_env_args", self.vf_env_args) or {}
        env = await self._environment(env_id, env_args)
        import verifiers as vf
        from openai import AsyncOpenAI

        rollout_input: dict[str, Any] = {
            "prompt": [message.to_openai() for message in episode.messages],
            "example_id": 0,
        }
        for key in ("answer", "info"):
            if key in fields:
                rollout_input[key] = fields[key]
        sampling = episode.task.sampling
        async with episode.gateway() as endpoint:
            openai = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
            try:
                client = vf.OpenAIChatCompletionsClient(openai)
                state = await env.rollout(
                    rollout_input,
                    client,
                    episode.policy.config.model,
                    sampling.model_dump(exclude_none=True) if sampling else {},
                )
                if state.get("error") is None:
                    await env.rubric.score_rollout(state)
                await env.rubric.cleanup(state)
            finally:
                await openai.close()
            if endpoint.end is not None:  # a call ran into the episode's end: that is the end
                raise endpoint.end
        return _verdict(env_id, state)

    async def _environment(self, env_id: str, env_args: Any) -> Any:
        if not isinstance(env_args, dict):
            raise EpisodeEnd(
                "error", f"agent '{_NAME}': vf_env_args must be an object, got {env_args!r}"
            )
        key = f"{env_id} {json.dumps(env_args, sort_keys=True, default=str)}"
        if key not in self._loaded:
            if importlib.util.find_spec("verifiers") is None:
                raise EpisodeEnd(
                    "error",
                    f"agent '{_NAME}': verifiers is not installed; pip install "
                    "'rayrollout[verifiers]' into a venv of its own (python3 -m venv "
                    ".venv-verifiers && .venv-verifiers/bin/pip install 'rayrollout[verifiers]')",
                )
            try:
                self._loaded[key] = await asyncio.to_thread(
                    load_verifiers_environment, env_id, env_args
                )
            except Exception as exc:
                raise EpisodeEnd(
                    "error",
                    f"agent '{_NAME}': verifiers environment {env_id!r} did not load: "
                    f"{type(exc).__name__}: {exc}",
                ) from exc
        return self._loaded[key]


def _verdict(env_id: str, state: Any) -> Verification:
    """The rubric's score as the episode's verdict, or the rollout's error as its end."""
    error = state.get("error")
    if error is not None:
        raise EpisodeEnd(
            "error",
            f"agent '{_NAME}': verifiers environment {env_id!r}: {type(error).__name__}: {error}",
        )
    reward = state.get("reward")
    if not isinstance(reward, int | float) or not math.isfinite(reward):
        raise EpisodeEnd(
            "error", f"agent '{_NAME}': verifiers environment {env_id!r} scored {reward!r}"
        )
    details = {
        "metrics": dict(state.get("metrics") or {}),
        "model_calls": len(state.get("trajectory") or []),  # verifiers' own count
        "stop_condition": state.get("stop_condition"),
        "is_truncated": bool(state.get("is_truncated")),
    }
    return Verification(reward=float(reward), details=details)
