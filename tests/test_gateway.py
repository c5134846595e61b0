"""The recording gateway with the real OpenAI SDK against the scripted policy on Serve.

Each test plays a weather episode the way a black-box program would (the SDK for the model,
plain HTTP for the tools) and checks what the episode recorded: turns, whether each extends
the one before, what each sent, the transcript the verifier reads, and how ends and bad
requests are answered.
"""

from contextlib import asynccontextmanager

import aiohttp
import openai
import pytest
from served_policy import scripted_policy_on_serve

from rayrollout.agentkit import AgentEpisode, EpisodeEnd, OutOfTurns
from rayrollout.agentkit.gateway import TOOL_ERROR_HEADER, Gateway
from rayrollout.data.config import EpisodeConfig, PolicyConfig
from rayrollout.data.convert import chat_tools_to_responses
from rayrollout.data.schema import Message, Task, Trajectory
from rayrollout.environments.weather.env import WeatherEnv
from rayrollout.envkit.sessions import InlineSession
from rayrollout.policy.client import PolicyClient

KEY = "gateway-test-policy-key"
PROMPT = "What's the weather like in Paris?"


@pytest.fixture(scope="module")
def policy_url(serve_session):
    with scripted_policy_on_serve("gateway-policy", serve_session, KEY) as url:
        yield url


@asynccontextmanager
async def weather_episode(policy_url, prompt=PROMPT, max_turns=8, **policy):
    """A weather episode on a fresh gateway; everything closed afterwards."""
    config = PolicyConfig(model="scripted", **policy)
    client = PolicyClient(config, policy_url, api_key=KEY)
    gateway = Gateway()
    task = Task(task_id="t", environment="weather", prompt=[Message(role="user", content=prompt)])
    trajectory = Trajectory(task_id="t", sample_index=0, group_id="t", environment="weather")
    episode = AgentEpisode(
        task,
        WeatherEnv.tool_schemas(),
        InlineSession(WeatherEnv, task),
        client,
        EpisodeConfig(max_turns=max_turns),
        trajectory,
        "t:0:gateway",
        gateway,
    )
    try:
        yield episode
    finally:
        await gateway.close()
        await client.close()


def sdk(endpoint):
    return openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)


def bearer(endpoint):
    return {"Authorization": f"Bearer {endpoint.api_key}"}


async def run_tool(http, endpoint, name, arguments):
    async with http.post(
        f"{endpoint.tools_url}/{name}", data=arguments, headers=bearer(endpoint)
    ) as response:
        assert response.status == 200, await response.text()
        return await response.text(), response.headers.get(TOOL_ERROR_HEADER)


async def test_chat_calls_through_the_sdk_are_recorded_as_one_sequence(policy_url):
    async with weather_episode(policy_url) as episode, aiohttp.ClientSession() as http:
        async with episode.gateway() as endpoint:
            client = sdk(endpoint)
            async with http.get(endpoint.tools_url, headers=bearer(endpoint)) as response:
                tools = await response.json()
            assert tools == WeatherEnv.tool_schemas()
            messages = [m.to_openai() for m in episode.task.prompt]
            first = await client.chat.completions.create(
                model="whatever-the-script-says", messages=messages, tools=tools, temperature=0.5
            )
            reply = first.choices[0].message
            assert first.choices[0].finish_reason == "tool_calls" and first.model == "scripted"
            messages.append(reply)  # the SDK's object, sent back as it is (refusal: null...)
            [call] = reply.tool_calls
            result, error = await run_tool(
                http, endpoint, call.function.name, call.function.arguments
            )
            assert result == "The weather in Paris is " + result.split(" is ", 1)[1] and not error
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            second = await client.chat.completions.create(
                model="scripted", messages=messages, tools=tools
            )
            answer = second.choices[0].message.content
            assert answer == f"Here is the current weather: {result}"
            await client.close()
        turns = episode.trajectory.turns
        assert [t.extends_previous for t in turns] == [False, True]
        assert [t.prompt_message_count for t in turns] == [1, 3]
        assert [t.sent_messages for t in turns] == [None, None]
        assert first.usage.prompt_tokens == turns[0].prompt_tokens > 0
        assert [m.role for m in episode.messages] == ["user", "assistant", "tool", "assistant"]
        assert episode.messages[-1].content == answer
        assert episode.trajectory.metrics.tool_calls == 1
        assert (await episode.verify()).reward == 1.0


async def test_keys_are_per_episode_and_a_closed_episode_is_gone(policy_url):
    gateway_url = None
    async with weather_episode(policy_url) as episode, aiohttp.ClientSession() as http:
        assert episode._gateway.url is None  # nothing bound before an episode opens it
        async with episode.gateway() as endpoint:
            gateway_url = episode._gateway.url
            assert endpoint.api_key not in repr(endpoint)
            models = f"{endpoint.base_url}/models"
            for headers in ({}, {"Authorization": "Bearer not-the-key"}):
                async with http.get(models, headers=headers) as response:
                    assert response.status == 401, await response.text()
            async with http.get(models, headers=bearer(endpoint)) as response:
                assert response.status == 200
                assert [m["id"] for m in (await response.json())["data"]] == ["scripted"]
            stranger = models.replace(endpoint.base_url.split("/")[-2], "no-such-token")
            async with http.get(stranger, headers=bearer(endpoint)) as response:
                assert response.status == 404
        async with http.get(models, headers=bearer(endpoint)) as response:
            assert response.status == 404  # the token is forgotten with the block
        client = sdk(endpoint)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        await client.close()
    assert gateway_url is not None and gateway_url.startswith("http://127.0.0.1:")


async def test_the_responses_api_records_the_same_episode(policy_url):
    async with weather_episode(policy_url) as episode, aiohttp.ClientSession() as http:
        async with episode.gateway() as endpoint:
            client = sdk(endpoint)
            tools = chat_tools_to_responses(episode.tools)
            items = [{"role": "user", "content": PROMPT}]
            first = await client.responses.create(model="m", input=items, tools=tools)
            [call] = [item for item in first.output if item.type == "function_call"]
            result, _ = await run_tool(http, endpoint, call.name, call.arguments)
            output = {"type": "function_call_output", "call_id": call.call_id, "output": result}
            # The conversation kept by the gateway (previous_response_id) ...
            second = await client.responses.create(
                model="m", previous_response_id=first.id, input=[output], tools=tools
            )
            assert second.output_text == f"Here is the current weather: {result}"
            # ... or sent whole, the output items as the SDK parsed them.
            items += [item.model_dump(exclude_none=True) for item in first.output]
            items += [output, *(item.model_dump(exclude_none=True) for item in second.output)]
            items.append({"role": "user", "content": "Thanks!"})
            await client.responses.create(model="m", input=items, tools=tools)
            await client.close()
        turns = episode.trajectory.turns
        assert [t.extends_previous for t in turns] == [False, True, True]
        assert [t.prompt_message_count for t in turns] == [1, 3, 5]
        roles = ["user", "assistant", "tool", "assistant", "user", "assistant"]
        assert [m.role for m in episode.messages] == roles
        assert (await episode.verify()).reward == 1.0


async def test_tool_mistakes_are_answered_and_streams_and_bad_bodies_handled(policy_url):
    async with weather_episode(policy_url) as episode, aiohttp.ClientSession() as http:
        async with episode.gateway() as endpoint:
            text, error = await run_tool(http, endpoint, "no_such_tool", "{}")
            assert error == "1" and "no_such_tool" in text
            text, error = await run_tool(http, endpoint, "get_weather", '{"city": ""}')
            assert error == "1" and "city" in text

            client = sdk(endpoint)
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
                tools=episode.tools,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            [call] = chunks[0].choices[0].delta.tool_calls
            assert call.function.name == "get_weather" and "Paris" in call.function.arguments
            assert chunks[1].choices[0].finish_reason == "tool_calls"
            assert chunks[-1].usage.completion_tokens > 0
            await client.close()

            chat = f"{endpoint.base_url}/chat/completions"
            user = {"role": "user", "content": "hi"}
            for body, param in (
                ({"model": "m"}, "messages"),
                ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
                ({"messages": [user], "temperature": -1}, "temperature"),
                ({"messages": [user], "max_completion_tokens": 0}, "max_completion_tokens"),
                ({"messages": [user], "tools": [{"type": "function"}]}, "tools[0]"),
            ):
                async with http.post(chat, json=body, headers=bearer(endpoint)) as response:
                    assert response.status == 400, body
                    assert (await response.json())["error"]["param"] == param
            async with http.post(chat, data=b"{not json", headers=bearer(endpoint)) as response:
                assert response.status == 400
        assert len(episode.trajectory.turns) == 1  # only the streamed call reached the model


async def test_running_out_of_turns_ends_the_episode_instead_of_erroring(policy_url):
    async with weather_episode(policy_url, max_turns=1) as episode:
        with pytest.raises(OutOfTurns):
            async with episode.gateway() as endpoint:
                client = sdk(endpoint)
                messages = [{"role": "user", "content": PROMPT}]
                await client.chat.completions.create(model="m", messages=messages)
                with pytest.raises(openai.APIStatusError) as refused:
                    await client.chat.completions.create(model="m", messages=messages)
                assert refused.value.status_code == 410  # not retried by the SDK
                assert isinstance(endpoint.end, OutOfTurns)
                await client.close()
        assert len(episode.trajectory.turns) == 1


async def test_a_policy_that_fails_for_good_ends_the_episode_with_its_status(policy_url):
    slow = "What's the weather like in Paris? [[sleep=3]]"
    async with weather_episode(policy_url, slow, timeout_s=0.5, max_retries=0) as episode:
        with pytest.raises(EpisodeEnd) as ended:
            async with episode.gateway() as endpoint:
                client = sdk(endpoint)
                with pytest.raises(openai.APIStatusError) as refused:
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": slow}]
                    )
                assert refused.value.status_code == 410
                await client.close()
                raise RuntimeError("the program gave up")  # the recorded end wins over this
        assert ended.value.status == "timeout" and "timed out" in ended.value.error


async def test_a_rewritten_history_pins_what_the_earlier_turns_sent(policy_url):
    async with weather_episode(policy_url) as episode:
        async with episode.gateway() as endpoint:
            client = sdk(endpoint)
            prompt = [{"role": "user", "content": PROMPT}]
            await client.chat.completions.create(model="m", messages=prompt, tools=episode.tools)
            other = [{"role": "user", "content": "What's the weather like in Oslo?"}]
            await client.chat.completions.create(model="m", messages=other, tools=episode.tools)
            await client.close()
        first, second = episode.trajectory.turns
        assert first.sent_messages == [Message(role="user", content=PROMPT)]
        assert first.prompt_message_count == 0
        assert (second.sent_messages, second.prompt_message_count) == (None, 1)
        assert not second.extends_previous
        assert [m.content for m in episode.messages[:1]] == [other[0]["content"]]
        assert len(episode.messages) == 2
