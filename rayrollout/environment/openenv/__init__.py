"""OpenEnv environments (the ``openenv`` package's standard), played by the ``reset_step``
agent: by URL over the WebSocket session of OpenEnv's own server, or by class in the worker.

Lives here: the channel contract and its errors (``channel``), the two channels (``socket``:
a server by URL; ``inline``: the class in this process), the translation between the
model's chat and OpenEnv's actions, tools and observations (``actions``), one episode on a
channel (``episode``) and the environment registered as 'openenv' (``environment``). Only
``inline`` imports ``openenv`` (the optional extra ``rayrollout[openenv]``), and only when an
episode opens; by URL needs nothing beyond rayrollout.

May import: ``rayrollout.data``, ``rayrollout.environment`` and ``rayrollout.errors``.
"""

from rayrollout.environment.openenv.channel import ActionRejected, OpenEnvError
from rayrollout.environment.openenv.environment import OpenEnvEnvironment

__all__ = ["ActionRejected", "OpenEnvEnvironment", "OpenEnvError"]
