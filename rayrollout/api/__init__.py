"""The Python API a driver or training loop holds: ``RolloutEngine`` (``rollout_engine``),
what one ``collect`` runs, read and checked once (``collect``), and the long-lived cluster
services of ``rayrollout up`` (``cluster``).

May import: the engine and everything below it; never the CLI.
"""
