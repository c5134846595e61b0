"""NeMo Gym's resources-server protocol: a client for servers by URL (``client``; its
Gymnasium-style servers, played by reset and step, in ``gymnasium``), the same routes on our
environments' Serve apps (``routes``, ``aggregate_metrics``), and the config blocks and ng_run
entrypoints that let NeMo Gym's own agents use them and its rollout collection drive the
rollout service (``ng_run_config``, ``server/``).
"""
