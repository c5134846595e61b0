"""OpenEnv environments (the ``openenv`` package's standard), played by the ``reset_step``
agent: by URL over OpenEnv's WebSocket session (``socket``), or the class in the worker
(``inline``, the only module importing ``openenv``, the ``rayrollout[openenv]`` extra).

May import: ``rayrollout.data``, ``rayrollout.envkit`` and ``rayrollout.errors``.
"""

from rayrollout.envkit.openenv.channel import ActionRejected, OpenEnvError
from rayrollout.envkit.openenv.environment import OpenEnvEnvironment

__all__ = ["ActionRejected", "OpenEnvEnvironment", "OpenEnvError"]
