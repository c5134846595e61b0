"""Ray Serve applications for the policy: the scripted policy (and, later, vLLM)."""
