"""One name per environment, its config args, duplicate registrations, one tool-call checker."""

from importlib.metadata import EntryPoint

import pytest
from fixture_envs import CounterEnv, GreeterEnv

from rayrollout import plugins
from rayrollout.data.config import EnvironmentConfig, RunConfig
from rayrollout.data.schema import Message, Task
from rayrollout.envkit import Environment, Episode, ToolResult, Verification, registry, tool
from rayrollout.envkit.nemo_gym.client import NemoGymConnections, RemoteSession
from rayrollout.envkit.registry import (
    DuplicateEnvironmentError,
    EnvironmentArgsError,
    UnknownEnvironmentError,
    environment_spec,
)
from rayrollout.envkit.sessions import EnvSession, InlineSession, ServeSession

GREETER = "fixture_envs:GreeterEnv"
WEATHER = "rayrollout.environments.weather.env:WeatherEnv"


def task(environment: str = "ahoy") -> Task:
    return Task(task_id="t", environment=environment, prompt=[Message(role="user", content="hi")])


def test_config_args_reach_the_constructor():
    spec = environment_spec("ahoy", EnvironmentConfig(path=GREETER, args={"greeting": "ahoy"}))
    assert (spec.name, spec.target, spec.args) == ("ahoy", GREETER, {"greeting": "ahoy"})
    assert isinstance(spec.create(task()), GreeterEnv)
    assert spec.create(task()).greeting == "ahoy"
    assert environment_spec(GREETER).create(task()).greeting == "hello"


async def test_an_inline_session_is_built_with_the_config_args():
    config = RunConfig.model_validate(
        {"environments": {"ahoy": {"path": GREETER, "args": {"greeting": "ahoy"}}}}
    )
    from rayrollout.engine.episode_spec import EpisodeSpec
    from rayrollout.engine.worker import WorkerRunner, WorkerSpec

    runner = WorkerRunner(WorkerSpec("worker:test", config, "http://127.0.0.1:1/v1"))
    try:
        env_cls = runner._env_class("ahoy")
        session = runner._session(env_cls, "ahoy", EpisodeSpec(task()), "e1")
        assert isinstance(session, InlineSession)
        result = await session.call_tool("greet", '{"who": "bob"}')
        assert result == ToolResult(content="ahoy, bob")
    finally:
        await runner.policy.close()


async def test_hosting_is_looked_up_by_the_registered_name_not_the_class_name():
    # CounterEnv says name="counter" and default_hosting="serve"; registered as
    # "local-counter" with hosting: inline, the override is what counts.
    config = RunConfig.model_validate(
        {
            "environments": {
                "local-counter": {"path": "fixture_envs:CounterEnv", "hosting": "inline"}
            }
        }
    )
    from rayrollout.engine.episode_spec import EpisodeSpec
    from rayrollout.engine.worker import WorkerRunner, WorkerSpec

    runner = WorkerRunner(WorkerSpec("worker:test", config, "http://127.0.0.1:1/v1"))
    try:
        env_cls = runner._env_class("local-counter")
        assert env_cls is CounterEnv
        spec = EpisodeSpec(task("local-counter"))
        assert isinstance(runner._session(env_cls, "local-counter", spec, "e1"), InlineSession)
    finally:
        await runner.policy.close()


def test_args_that_do_not_fit_the_constructor_name_both():
    spec = environment_spec("ahoy", EnvironmentConfig(path=GREETER, args={"colour": "red"}))
    with pytest.raises(EnvironmentArgsError, match=r"environments\.ahoy\.args \['colour'\]"):
        spec.load()


def test_a_config_path_for_a_registered_name_with_another_class_is_an_error():
    with pytest.raises(DuplicateEnvironmentError) as raised:
        environment_spec("weather", EnvironmentConfig(path=GREETER))
    assert WEATHER in str(raised.value) and GREETER in str(raised.value)
    # The registered class under its own name, or under a second name, is fine.
    assert environment_spec("weather", EnvironmentConfig(path=WEATHER)).target == WEATHER
    assert environment_spec("windy", EnvironmentConfig(path=WEATHER)).target == WEATHER


def test_two_entry_points_for_one_name_are_an_error_naming_both(monkeypatch):
    group = registry.ENTRY_POINT_GROUP
    twins = [
        EntryPoint("echo", "fixture_envs:EchoEnv", group),
        EntryPoint("echo", "fixture_envs:FaultyEnv", group),
    ]
    monkeypatch.setattr(plugins, "entry_points", lambda group: twins)
    registry.ENVIRONMENTS.clear()
    try:
        with pytest.raises(DuplicateEnvironmentError) as raised:
            environment_spec("echo")
        assert "fixture_envs:EchoEnv" in str(raised.value)
        assert "fixture_envs:FaultyEnv" in str(raised.value)
    finally:
        monkeypatch.undo()
        registry.ENVIRONMENTS.clear()


def test_an_unknown_name_says_how_to_register_it():
    with pytest.raises(UnknownEnvironmentError, match="unknown environment 'atlantis'"):
        environment_spec("atlantis")


class Adder(Environment):
    @tool
    async def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: First.
            b: Second.
        """
        return a + b

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=1.0)


@pytest.mark.parametrize(
    ("name", "arguments"),
    [("add", '{"a": '), ("add", "[1, 2]"), ("add", "[" * 100_000), ("subtract", "{}")],
    ids=["bad-json", "not-an-object", "too-deep", "unknown-tool"],
)
async def test_inline_and_remote_sessions_tell_the_model_the_same_mistake(name, arguments):
    remote_task = task("adder").model_copy(update={"tools": Adder.tool_schemas()})
    remote = NemoGymConnections().session(
        "adder", EnvironmentConfig(url="http://127.0.0.1:1"), remote_task
    )
    inline = await Adder(remote_task).call_tool(name, arguments)
    assert inline.is_error
    assert await remote.call_tool(name, arguments) == inline  # answered before any request


class _Handle:
    def options(self, **kwargs: object) -> "_Handle":
        return self


def test_every_session_kind_satisfies_the_session_protocol():
    sessions = [
        InlineSession(GreeterEnv, task()),
        ServeSession(_Handle(), False, "e1", task()),  # type: ignore[arg-type]
        RemoteSession(NemoGymConnections(), "r", EnvironmentConfig(url="http://h:1"), task()),
    ]
    for session in sessions:
        assert isinstance(session, EnvSession)
        assert session.lost is False
