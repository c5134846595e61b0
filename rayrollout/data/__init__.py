"""Data model and I/O: what a run reads and writes, and nothing that runs episodes.

Lives here: the task and trajectory models and their Arrow schema (``schema``), the run
configuration (``config``; per-environment settings in ``environment_config``), task files
(``tasks``; NeMo Gym's row shapes in ``nemo_gym_rows``; shard sets through Ray Data in
``task_shards``, ``task_shard_head``, ``task_shard_source`` and ``task_shard_reader``; ids
and resume keys as fixed-size digests in ``task_digests``), Chat <-> Responses-API
conversion (``convert``), a run's output folder (``run_folder``: the one owner of its parts,
lock, rejects, resume keys and reading), its writers (``writer``) and exports (``export/``).

May import: the standard library, third-party libraries and ``rayrollout.errors``; never
another part of rayrollout, so every other part can build on it.
"""
