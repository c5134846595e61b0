"""Weather environment: the tool, the verifier, the task files, and both hosting modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayrollout.data.schema import FunctionCall, Message, Task, ToolCall
from rayrollout.data.tasks import read_tasks
from rayrollout.environments.weather.env import WeatherEnv
from rayrollout.envkit import Episode, ToolResult, Verification
from rayrollout.envkit.sessions import EnvSession
from rayrollout.envkit.testing import play_in_both_hostings

HERE = Path(__file__).resolve().parents[1]
TASK = Task(
    task_id="weather-test",
    environment="weather",
    prompt=[Message(role="user", content="What's the weather like in New York?")],
)


def call(name: str, arguments: dict) -> Message:
    return Message(
        role="assistant",
        tool_calls=[
            ToolCall(id="c1", function=FunctionCall(name=name, arguments=json.dumps(arguments)))
        ],
    )


def episode(*messages: Message) -> Episode:
    return Episode(task=TASK, messages=[*TASK.prompt, *messages])


async def test_get_weather_reports_the_same_weather_for_the_same_city():
    env = WeatherEnv(TASK)
    first = await env.call_tool("get_weather", '{"city": "New York"}')
    again = await env.call_tool("get_weather", '{"city": "  new   york "}')
    assert not first.is_error
    assert first.content.startswith("The weather in New York is ")
    assert first.content.endswith("°C.")
    assert again.content.replace("new york", "New York") == first.content


async def test_get_weather_differs_between_cities():
    env = WeatherEnv(TASK)
    reports = {
        (await env.call_tool("get_weather", json.dumps({"city": city}))).content.split(" is ")[1]
        for city in ["Paris", "Tokyo", "New York", "Lagos", "Oslo", "Lima"]
    }
    assert len(reports) > 1


@pytest.mark.parametrize("city", ["", "   "])
async def test_get_weather_rejects_a_blank_city(city: str):
    result = await WeatherEnv(TASK).call_tool("get_weather", json.dumps({"city": city}))
    assert result.is_error
    assert "city is empty" in result.content


async def test_get_weather_reports_a_missing_city_argument():
    result = await WeatherEnv(TASK).call_tool("get_weather", "{}")
    assert result.is_error
    assert "city" in result.content


def test_tool_schema_comes_from_the_signature_and_docstring():
    (schema,) = WeatherEnv.tool_schemas()
    assert schema["function"]["name"] == "get_weather"
    assert schema["function"]["description"] == "Get the current weather in a city."
    parameters = schema["function"]["parameters"]
    assert parameters["required"] == ["city"]
    assert parameters["properties"]["city"]["type"] == "string"
    assert parameters["additionalProperties"] is False


def test_weather_env_is_stateless_and_inline_by_default():
    assert WeatherEnv.name == "weather"
    assert WeatherEnv.default_hosting == "inline"
    assert not WeatherEnv.is_stateful()


REPORT = Message(role="tool", tool_call_id="c1", content="The weather in New York is fog, 12 °C.")
ANSWER = Message(role="assistant", content="It is foggy and 12 °C in New York.")


@pytest.mark.parametrize(
    ("messages", "reward", "called"),
    [
        pytest.param(
            [call("get_weather", {"city": "New York"}), REPORT, ANSWER],
            1.0,
            ["get_weather"],
            id="called-get-weather",
        ),
        pytest.param([ANSWER], 0.0, [], id="answered-without-tools"),
        pytest.param(
            [call("search", {"q": "weather"}), REPORT, ANSWER],
            0.0,
            ["search"],
            id="called-another-tool",
        ),
        pytest.param(
            [call("get_weather", {"city": ""}), REPORT, ANSWER],
            1.0,
            ["get_weather"],
            id="failed-call-still-counts",
        ),
        pytest.param([], 0.0, [], id="no-reply"),
    ],
)
async def test_verifier_rewards_calling_get_weather(messages: list, reward: float, called: list):
    verification = await WeatherEnv(TASK).verify(episode(*messages))
    assert verification.reward == reward
    assert verification.details == {"tools_called": called}


def test_example_tasks_load_in_both_row_formats():
    own = list(read_tasks(HERE / "tasks.jsonl"))
    nemo = list(read_tasks(HERE / "tasks_nemo_gym.jsonl", default_environment="weather"))
    assert 5 <= len(own) <= 10
    assert len(nemo) == 5
    for task in own + nemo:
        assert task.environment == "weather"
        assert task.prompt[-1].content.startswith("What's the weather like in ")
    for task in nemo:
        assert task.prompt[0].role == "system"
        assert task.tools is not None
        # The NeMo Gym file carries its own tool schema: it must match what the env serves.
        served = WeatherEnv.tool_schemas()[0]["function"]
        offered = task.tools[0]["function"]
        assert offered["name"] == served["name"]
        assert (
            offered["parameters"]["properties"].keys() == served["parameters"]["properties"].keys()
        )
        assert offered["parameters"]["required"] == served["parameters"]["required"]


async def play_small_episode(session: EnvSession) -> tuple[ToolResult, Verification]:
    result = await session.call_tool("get_weather", '{"city": "New York"}')
    reply = Message(role="tool", tool_call_id="c1", content=result.content)
    call_message = call("get_weather", {"city": "New York"})
    return result, await session.verify(episode(call_message, reply, ANSWER))


@pytest.mark.usefixtures("serve_session")
async def test_inline_and_serve_hosting_give_the_same_results():
    inline, served = await play_in_both_hostings(WeatherEnv, TASK, play_small_episode)
    assert served == inline
    assert inline[1].reward == 1.0
