"""The engine: the Ray actors that play a run's episodes (the ``engine`` actor, its workers,
the episode around an agent's loop) and what feeds, drains and measures them.

May import: ``rayrollout.data``, ``rayrollout.envkit``, ``rayrollout.policy`` and
``rayrollout.errors``; never the API or the CLI.
"""
