"""The Python API a driver or training loop holds: ``RolloutEngine`` (``rollout_engine``),
what one ``collect`` runs, its tasks checked as they stream (``collect``; read in a thread,
``spec_feed``), the detached engine of ``rayrollout up`` (``cluster``) and its HTTP service.

May import: the engine and everything below it; never the CLI.
"""
