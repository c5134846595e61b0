"""The Python API a driver or training loop holds: ``RolloutEngine`` (``rollout_engine``),
what one ``collect`` runs, its tasks checked as they stream (``collect``; read in a thread,
``spec_feed``), and the long-lived cluster services of ``rayrollout up`` (``cluster``).

May import: the engine and everything below it; never the CLI.
"""
