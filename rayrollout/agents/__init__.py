"""The agents rayrollout ships, one file each (installed as ``rayrollout.agents``).

An agent is the loop of an episode (see ``rayrollout.agentkit``). Each file here is one agent a
newcomer can copy: ``tool_loop`` (the default: model -> tools -> model ... until an answer),
``context_budget`` (keeps the prompt under a token budget by dropping old turns),
``simulated_user`` (a second role: a user played by a script or by the model), ``program``
(any program, e.g. an OpenAI SDK script, run per episode against the recording gateway) and
``nemo_gym`` (a running NeMo Gym agent server's ``/run``, its model calls recorded).

May import: ``rayrollout.agentkit``, ``rayrollout.data``, ``rayrollout.envkit``,
``rayrollout.policy`` and ``rayrollout.errors``.
"""
