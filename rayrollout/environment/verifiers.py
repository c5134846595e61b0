"""The ``verifiers`` environment name: rows whose episode a verifiers environment plays.

A verifiers (Prime Intellect) environment is its own loop and its own judge, so it is run by
the ``verifiers`` agent (``agents/verifiers.py``: the environment's ``rollout`` against the
episode's recording gateway, its rubric's score as the reward). This class only gives such
rows an environment to name, and ``rayrollout env list`` a line for the source: it offers no
tools, and its verifier is never asked (the agent returns the rubric's verdict); a row that
names it with another agent gets an error saying which agent plays it.
"""

from __future__ import annotations

import importlib.util

from rayrollout.environment.contract import Environment, Episode, Verification

__all__ = ["VerifiersEnvironment"]


class VerifiersEnvironment(Environment):
    """A verifiers environment, played by the ``verifiers`` agent (row field ``vf_env``)."""

    name = "verifiers"
    source = "verifiers"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("verifiers") is None:
            return (
                "verifiers is not installed: pip install 'verifiers>=0.2,<0.3' (its pins clash "
                "with rayrollout's openenv extra: give it its own venv, as .ci/verifiers does)"
            )
        return None

    async def verify(self, episode: Episode) -> Verification:
        raise NotImplementedError(
            "environment 'verifiers' is played by the 'verifiers' agent (agent: verifiers in "
            "the row or --agent verifiers): the verifiers environment's rubric is its verifier"
        )
