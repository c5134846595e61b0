"""Policy deployments (installed as ``rayrollout.deployments``): the scripted policy and vLLM.

Each folder is a policy kind: its Serve application and a ``kind`` module holding its
``PolicyKind`` spec (how to deploy it, its weight-update backend), registered under the
``rayrollout.policies`` entry point. The engine finds them by name
(``rayrollout.policy.kinds``) and never imports this package.

May import: ``rayrollout.errors``, ``rayrollout.data``, ``rayrollout.envkit`` and
``rayrollout.policy``; never the engine, the API or the CLI.
"""
