"""The policy as the agents see it: an OpenAI-compatible client that keeps token ids.

Lives here: the client (``client``) over one HTTP pool per worker (``http``), token-in/
token-out rendering and tool-call parsing (``tokens``), and the gate that pauses model
calls for weight updates and stamps each turn's policy version (``gate``); ``Policy``, what
the episode loop needs of a policy (``protocol``); and policy kinds, found by name through
the ``rayrollout.policies`` entry points, with their weight-update backends (``kinds``).

May import: ``rayrollout.data`` and ``rayrollout.errors``; never environments, the engine,
the API or the CLI. Policy *deployments* (scripted, vLLM) are plugins in
``rayrollout.deployments``, found through ``kinds``, never imported by name.
"""
