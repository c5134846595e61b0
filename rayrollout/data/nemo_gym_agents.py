"""Which rayrollout agent plays a NeMo Gym task as NeMo Gym's own run would.

A task read from a NeMo Gym row (``nemo_gym_rows``) carries the row whole; its ``opening``
and its ``agent_ref`` say which NeMo Gym agent would play it. ``agent_for_row`` maps that to
a rayrollout agent: the NeMo Gym environment's default (``Environment.agent_for``), which
the row's own ``agent`` and the run's ``--agent`` still override.
"""

from __future__ import annotations

from rayrollout.data.nemo_gym_rows import NEMO_GYM_AGENT
from rayrollout.data.schema import Task

__all__ = ["AGENT_REF_AGENTS", "agent_for_row"]

AGENT_REF_AGENTS = {
    "gymnasium_agent": "reset_step",
    "aviary_agent": "reset_step",
    "toolsandbox_agent": "reset_step",
    "simple_agent": "tool_loop",
}
"""NeMo Gym agent kinds and the rayrollout agent that plays a row as that kind does.

A row's ``agent_ref.name`` names an agent server of NeMo Gym's config, which its configs
name ``<server>_<kind>`` (``blackjack_gymnasium_agent`` is a ``gymnasium_agent``), so a name
is matched by the kind it ends with: ``gymnasium_agent`` steps a Gymnasium-style server by
``/reset`` and ``/step``, ``aviary_agent`` and ``toolsandbox_agent`` step a seeded server
(both are the ``reset_step`` agent's loops), ``simple_agent`` is the tool loop. Other kinds
(harnesses, simulations) have no rayrollout match here."""


def agent_for_row(task: Task) -> str | None:
    """The rayrollout agent that plays a NeMo Gym task as NeMo Gym would, or None.

    A task opened by its server's ``/seed_session`` is stepped by ``reset_step``; one whose
    opening NeMo Gym's agent writes by ``nemo_gym``; otherwise the row's ``agent_ref`` names
    the NeMo Gym agent, matched by its kind (``AGENT_REF_AGENTS``). This is the
    environment's default (``Environment.agent_for``): the row's own ``agent`` and the run's
    ``--agent`` come first.
    """
    if task.opening == "seed_session":
        return "reset_step"
    if task.opening == "agent":
        return NEMO_GYM_AGENT
    agent_ref = task.fields.get("agent_ref")
    name = agent_ref.get("name") if isinstance(agent_ref, dict) else None
    if not isinstance(name, str):
        return None
    for kind, agent in AGENT_REF_AGENTS.items():
        if name == kind or name.endswith(f"_{kind}"):
            return agent
    return None
