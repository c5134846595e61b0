import rayrollout

DOCUMENTED = {
    "CollectResult",
    "Environment",
    "Episode",
    "InvalidTaskError",
    "Message",
    "RolloutEngine",
    "RunConfig",
    "Task",
    "ToolError",
    "ToolResult",
    "Trajectory",
    "Verification",
    "load_config",
    "read_tasks",
    "read_trajectories",
    "tool",
    "trajectory_arrow_schema",
}


def test_public_names_are_the_documented_ones():
    assert set(rayrollout.__all__) == DOCUMENTED


def test_every_public_name_is_importable_and_documented():
    for name in rayrollout.__all__:
        value = getattr(rayrollout, name)
        assert value.__doc__, f"rayrollout.{name} has no docstring"
