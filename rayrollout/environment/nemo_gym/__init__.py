"""NeMo Gym's resources-server protocol: a client for servers by URL (``client``), the same
routes on our environments' Serve apps (``routes``, ``metrics``), and the config blocks and
ng_run entrypoint that let NeMo Gym's own agents use them (``config``, ``server/``).
"""
