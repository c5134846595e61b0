"""The engine: the Ray actors that play episodes and the pipeline that feeds and drains them.

Lives here: the engine actor's collect pipeline (``actor``), its training-loop methods
(``training``) and environment deployment (``deploy``), worker actors (``worker``) and the
episode around an agent's loop (``episode``), what workers hand back (``chunks``), GRPO
groups (``groups``), run statistics and live metrics (``stats``, ``metrics``), weight
updates (``weights``), where parts run (``placement``) and starting Ray, Serve and the
policy (``services``).

May import: ``rayrollout.data``, ``rayrollout.environment``, ``rayrollout.policy`` and
``rayrollout.errors``; never the API or the CLI.
"""
