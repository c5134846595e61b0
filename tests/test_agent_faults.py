"""A faulty agent ends its own episode with a status and an error naming it; the run goes on.

A real run on the local Ray (scripted policy on Serve, the echo environment inline): tasks
choose their agent by the row's ``agent`` field, by registered name or ``module:Class``
(``fixture_agents``), with a function agent and config args among them.
"""

from rayrollout import RolloutEngine, RunConfig

ENVS = {"echo": {"path": "fixture_envs:EchoEnv", "hosting": "inline"}}


def test_faulty_agents_end_their_episodes_and_spare_the_rest(tmp_path, serve_session):
    config = RunConfig.model_validate(
        {
            "namespace": "agent-faults",
            "environments": ENVS,
            "output": {"dir": str(tmp_path / "out")},
            "ray": {"serve_port": serve_session},
            "concurrency": 16,
            "workers": {"num_workers": 1},
            # Long enough for every other episode on a machine whose load is in the tens, so
            # only the agent that never returns times out.
            "episode": {"timeout_s": 20.0},
            "agent_settings": {
                "once": {"path": "fixture_agents:answer_once", "args": {"suffix": " (once)"}}
            },
        }
    )
    agents = {
        "raises": "fixture_agents:Raises",
        "hangs": "fixture_agents:Hangs",
        "garbage": "fixture_agents:Garbage",
        "unknown": "no_such_agent",
        "once": "once",
    }
    tasks = [
        {"task_id": name, "prompt": f"say {name}", "environment": "echo", "agent": agent}
        for name, agent in agents.items()
    ] + [{"task_id": f"ok-{i}", "prompt": f"say {i}", "environment": "echo"} for i in range(6)]
    with RolloutEngine(config) as engine:
        result = engine.collect(tasks)
    rows = {t.task_id: t for t in result.trajectories()}
    assert len(rows) == len(tasks)

    raises = rows["raises"]
    assert raises.status == "error"
    assert raises.error == (
        "agent 'fixture_agents:Raises' failed: ValueError: the harness lost its place"
    )
    assert len(raises.turns) == 1  # what it did before it broke is kept
    assert rows["hangs"].status == "timeout"
    assert rows["hangs"].error == "agent 'fixture_agents:Hangs' did not finish within 20.0s"
    assert rows["garbage"].status == "error"
    assert "agent 'fixture_agents:Garbage' returned dict" in rows["garbage"].error
    assert rows["unknown"].status == "error"
    assert rows["unknown"].error.startswith("agent 'no_such_agent' unavailable: unknown agent")
    assert "tool_loop" in rows["unknown"].error  # names what is registered

    once = rows["once"]
    assert (once.status, once.played_by) == ("ok", "once")
    assert once.messages[-1].content.endswith(" (once)")
    assert [t.prompt_message_count for t in once.turns] == [1]
    for i in range(6):
        ok = rows[f"ok-{i}"]
        assert (ok.status, ok.reward, ok.played_by) == ("ok", 1.0, "tool_loop")
        assert [t.extends_previous for t in ok.turns] == [False, True]
        assert [t.prompt_message_count for t in ok.turns] == [1, 3]
        assert all(t.sent_messages is None and t.speaker == "policy" for t in ok.turns)
