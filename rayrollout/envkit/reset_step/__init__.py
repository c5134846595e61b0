"""Reset/step environments: environments an episode plays by ``reset`` then ``step(action)``
until they end, as Gymnasium made common and skyrl-gym, GEM, OpenEnv and NeMo Gym's
Gymnasium-style servers all speak in their own forms.

Lives here: the session contract every source satisfies (``protocol``: ``ResetStepSession``,
``Opening``, ``StepResult``, ``reset_step_session``), the base of sources that run in this
process (``base``: ``ResetStepEnvironment``, the library's synchronous calls kept off the
event loop, each step's reward kept, the episode's reward their sum), and one module per
source: ``skyrl_gym`` (SkyRL's ``skyrl_gym.make``) and ``gem`` (GEM's ``gem.make``). Each
source's library is an optional extra, imported only when an episode opens.

The ``reset_step`` agent (``rayrollout/agents/reset_step.py``) plays every one of them.
A new source is
one more ``ResetStepSession``: an environment class like these (a session per episode, its
``setup`` opening it and its ``close`` always run), or a session kind of its own that speaks
to a server.

May import: ``rayrollout.data``, ``rayrollout.envkit`` and ``rayrollout.errors``.
"""

from rayrollout.envkit.reset_step.base import ResetStepEnvironment
from rayrollout.envkit.reset_step.protocol import (
    Opening,
    ResetStepError,
    ResetStepSession,
    StepResult,
    reset_step_session,
)

__all__ = [
    "Opening",
    "ResetStepEnvironment",
    "ResetStepError",
    "ResetStepSession",
    "StepResult",
    "reset_step_session",
]
