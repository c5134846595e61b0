"""The policy as the agents see it: an OpenAI-compatible client that keeps token ids.

Lives here: the client (``client``) over one HTTP pool per agent (``http``), token-in/
token-out rendering and tool-call parsing (``tokens``), and the gate that pauses model
calls for weight updates and stamps each turn's policy version (``gate``).

May import: ``rayrollout.data`` and ``rayrollout.errors``; never environments, the engine,
the API or the CLI. Policy *deployments* (scripted, vLLM) are plugins in
``rayrollout.deployments``, found by name.
"""
