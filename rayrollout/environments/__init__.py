"""rayrollout's own environments: one folder each (tools, verifier, example tasks, tests)."""
