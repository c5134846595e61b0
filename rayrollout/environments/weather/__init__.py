"""Weather: one made-up weather tool; the reward is for calling it (NeMo Gym's example)."""
