"""The scripted policy: a stand-in for the LLM's judgement that speaks the real OpenAI protocol.

Its policy kind is ``kind.SCRIPTED``.
"""

from rayrollout.deployments.scripted.server import ScriptedPolicy, scripted_policy_app

__all__ = ["ScriptedPolicy", "scripted_policy_app"]
