"""The policy as the agents see it: an OpenAI-compatible client that keeps token ids, the
gate that pauses model calls for weight updates, and policy kinds found by name, each
owning its settings.

May import: ``rayrollout.data`` and ``rayrollout.errors``; never environments, the engine,
the API or the CLI. Policy deployments are plugins (``rayrollout.deployments``).
"""
