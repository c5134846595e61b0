"""Images in episodes: read from task rows, returned by tools, stored once per row in
Parquet (data URLs in JSONL), and sent to the policy in both OpenAI APIs."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pyarrow.parquet as pq
import pytest
from netutil import served_routes
from PIL import Image
from recording_policy import body_images, recording_scripted_policy
from trajectories import write_through

from rayrollout.data.config import PolicyConfig
from rayrollout.data.images import ImageError, data_url, decode_data_url
from rayrollout.data.schema import (
    ContentPart,
    Message,
    Task,
    ToolCall,
    Trajectory,
    Turn,
    inline_images,
)
from rayrollout.data.tasks import InvalidTaskError, parse_task_row, read_tasks
from rayrollout.data.writer import JsonlSink, ParquetSink
from rayrollout.envkit import Environment, Episode, Verification, tool
from rayrollout.policy.call import PolicyRequest
from rayrollout.policy.client import PolicyClient


def png(color: str = "red", size: tuple[int, int] = (24, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


RED, BLUE = png("red"), png("blue", (8, 8))


def shown(message: Message) -> list[bytes]:
    """The bytes of each image a message shows."""
    return [decode_data_url(p.url or "")[1] for p in message.images]


# ---------------------------------------------------------------- task prompts


def test_a_chat_prompt_keeps_its_image_parts_in_order():
    content = [
        {"type": "text", "text": "How many circles?"},
        {"type": "image_url", "image_url": {"url": data_url(RED), "detail": "low"}},
        {"type": "text", "text": "Answer with a number."},
    ]
    task = parse_task_row(
        {"prompt": [{"role": "user", "content": content}]}, default_environment="e"
    )
    (message,) = task.prompt
    assert message.content == "How many circles?\nAnswer with a number."
    assert [p.type for p in message.parts or []] == ["text", "image", "text"]
    assert shown(message) == [RED] and message.images[0].detail == "low"
    # Sent back as the Chat Completions parts it came in.
    assert message.to_openai()["content"] == content


def test_a_responses_prompt_reads_input_image_items():
    items = [
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": data_url(BLUE), "detail": "auto"},
                {"type": "input_text", "text": "What colour?"},
            ],
        }
    ]
    task = parse_task_row({"prompt": items}, default_environment="e")
    assert shown(task.prompt[0]) == [BLUE] and task.prompt[0].content == "What colour?"


def test_an_image_only_user_message_is_a_prompt():
    row = {
        "prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": data_url(RED)}]}]
    }
    assert shown(parse_task_row(row, default_environment="e").prompt[0]) == [RED]


def test_image_paths_are_read_relative_to_the_task_file_and_urls_kept(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "red.png").write_bytes(RED)
    url = "https://example.com/cat.png"
    rows = [
        {
            "prompt": [
                {"role": "user", "content": [{"type": "image_url", "image_url": "pics/red.png"}]}
            ]
        },
        {"prompt": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = read_tasks(path, default_environment="e")
    assert shown(first.prompt[0]) == [RED]
    assert first.fields == {}  # the row's own keys are the prompt: nothing left over
    assert second.prompt[0].images[0].url == url  # kept as a URL, never fetched


def test_a_missing_image_file_is_a_row_error_naming_the_part(tmp_path):
    row = {
        "prompt": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": "nope.png"},
                ],
            }
        ]
    }
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(InvalidTaskError) as caught:
        list(read_tasks(path, default_environment="e"))
    assert caught.value.line == 1 and caught.value.field == "prompt[0].content[1]"
    assert "nope.png" in caught.value.message


def test_a_relative_image_path_of_rows_from_no_file_is_refused():
    row = {"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": "a.png"}]}]}
    with pytest.raises(InvalidTaskError, match="relative to the task file"):
        parse_task_row(row, default_environment="e")


def test_a_malformed_data_url_is_refused_naming_the_part():
    row = {
        "prompt": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": "data:image/png;base64,@@"}],
            }
        ]
    }
    with pytest.raises(InvalidTaskError) as caught:
        parse_task_row(row, default_environment="e")
    assert caught.value.field == "prompt[0].content[0]" and "base64" in caught.value.message


# ---------------------------------------------------------------- tool results


class PictureEnv(Environment):
    name = "picture"

    @tool
    async def pillow(self) -> Any:
        """A Pillow image."""
        return Image.new("RGB", (24, 16), "red")

    @tool
    async def raw(self) -> Any:
        """Image file bytes."""
        return BLUE

    @tool
    async def mcp(self) -> Any:
        """MCP content items: text and an image."""
        return [
            {"type": "text", "text": "zoomed"},
            {"type": "image", "data": base64.b64encode(BLUE).decode(), "mimeType": "image/png"},
        ]

    @tool
    async def words(self) -> Any:
        """Plain JSON, as before."""
        return {"count": 3}

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=0.0)


@pytest.mark.parametrize(
    ("name", "content", "images"),
    [("pillow", "", [RED]), ("raw", "", [BLUE]), ("mcp", "zoomed", [BLUE])],
)
async def test_a_tool_may_return_an_image(name, content, images):
    env = PictureEnv(
        Task(task_id="t", environment="picture", prompt=[Message(role="user", content="hi")])
    )
    result = await env.call_tool(name, "{}")
    assert not result.is_error and result.content == content
    message = Message(role="tool", tool_call_id="c", content=result.content, parts=result.parts)
    assert shown(message) == images


async def test_a_tool_without_images_answers_text_as_before():
    env = PictureEnv(
        Task(task_id="t", environment="picture", prompt=[Message(role="user", content="hi")])
    )
    result = await env.call_tool("words", "{}")
    assert result.content == '{"count": 3}' and result.parts is None


def test_bytes_of_no_image_format_are_refused():
    with pytest.raises(ImageError, match="no known image format"):
        data_url(b"not an image")


# ---------------------------------------------------------------- storage


def episode(turns: int = 6) -> Trajectory:
    """An episode showing RED in the prompt and in every one of ``turns`` tool results."""
    prompt = Message(
        role="user",
        content=[
            {"type": "text", "text": "Count."},
            {"type": "image_url", "image_url": data_url(RED)},
        ],
    )
    messages = [prompt]
    for i in range(turns):
        call = ToolCall.model_validate(
            {"id": f"c{i}", "function": {"name": "zoom", "arguments": "{}"}}
        )
        messages.append(Message(role="assistant", tool_calls=[call]))
        messages.append(
            Message(
                role="tool",
                tool_call_id=f"c{i}",
                content=[
                    {"type": "text", "text": f"zoom {i}"},
                    {"type": "image_url", "image_url": data_url(RED)},
                ],
            )
        )
    messages.append(Message(role="assistant", content="3"))
    trimmed = [
        prompt,
        Message(
            role="tool", tool_call_id="c0", parts=[ContentPart(type="image", url=data_url(BLUE))]
        ),
    ]
    return Trajectory(
        task_id="t",
        sample_index=0,
        group_id="g",
        environment="picture",
        messages=messages,
        turns=[Turn(prompt_message_count=1), Turn(sent_messages=trimmed)],
    )


def write(sink_type: type, tmp_path, trajectories: list[Trajectory]):
    return write_through(sink_type(tmp_path / sink_type.format, "run"), trajectories, 100)


def test_parquet_stores_each_image_once_per_row_and_reads_back_the_same_messages(tmp_path):
    trajectories = [
        episode(),
        Trajectory(
            task_id="u",
            sample_index=0,
            group_id="h",
            environment="e",
            messages=[Message(role="user", content="text only")],
        ),
    ]
    (path,) = write(ParquetSink, tmp_path, trajectories)
    rows = pq.read_table(path).to_pylist()
    images = rows[0]["images"]
    assert sorted(i["data"] for i in images) == sorted([RED, BLUE])  # 7 showings of RED, one copy
    red = next(i for i in images if i["data"] == RED)
    assert (red["mime"], red["width"], red["height"]) == ("image/png", 24, 16)
    parts = [p for m in rows[0]["messages"] for p in m["parts"] or [] if p["type"] == "image"]
    assert len(parts) == 7 and {p["sha256"] for p in parts} == {red["sha256"]}
    assert all(p["url"] is None for p in parts)  # no bytes repeated in the messages
    assert rows[1]["images"] == [] and rows[1]["messages"][0]["parts"] is None
    assert rows[1]["messages"][0]["content"] == "text only"
    back = [Trajectory.from_row(row) for row in rows]
    assert back[0].messages == trajectories[0].messages
    assert back[0].turns == trajectories[0].turns
    assert back == trajectories


def test_jsonl_keeps_data_urls_inline(tmp_path):
    trajectory = episode(2)
    (path,) = write(JsonlSink, tmp_path, [trajectory])
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert row["images"] == []
    assert row["messages"][0]["parts"][1]["url"] == data_url(RED)
    assert Trajectory.from_row(row) == trajectory


def test_a_row_refers_to_an_image_it_does_not_hold_is_an_error():
    row = episode(1).to_row()
    row["images"] = [{**row["images"][0], "sha256": "0" * 64}]
    with pytest.raises(ImageError, match="not in the row"):
        Trajectory.from_row(row)


def test_inline_images_leaves_a_text_row_as_it_is():
    row = Trajectory(task_id="u", sample_index=0, group_id="h", environment="e").to_row()
    assert inline_images(row) is row


# ---------------------------------------------------------------- the policy sees them


@pytest.fixture
async def scripted():
    async with recording_scripted_policy() as server:
        yield server


def conversation() -> list[Message]:
    """A prompt showing RED, a tool call, and its result showing BLUE."""
    call = ToolCall.model_validate({"id": "c1", "function": {"name": "zoom", "arguments": "{}"}})
    return [
        Message(
            role="user",
            content=[
                {"type": "text", "text": "Zoom in, then count."},
                {"type": "image_url", "image_url": data_url(RED)},
            ],
        ),
        Message(role="assistant", tool_calls=[call]),
        Message(
            role="tool",
            tool_call_id="c1",
            name="zoom",
            content="zoomed",
            parts=[
                ContentPart(type="text", text="zoomed"),
                ContentPart(type="image", url=data_url(BLUE)),
            ],
        ),
    ]


async def test_chat_completions_sends_image_url_parts(scripted):
    policy = PolicyClient(
        PolicyConfig(kind="openai", model="scripted"),
        scripted.url,
        api_key="secret",
    )
    try:
        reply = await policy.complete(PolicyRequest(conversation()))
    finally:
        await policy.close()
    assert reply.message.content  # the scripted policy answered
    (body,) = scripted.bodies
    user, _, tool_message = body["messages"]
    assert user["content"][1] == {"type": "image_url", "image_url": {"url": data_url(RED)}}
    assert tool_message["content"][1]["type"] == "image_url"
    assert body_images(body) == [RED, BLUE]


async def test_the_responses_api_sends_input_image_items(scripted):
    config = PolicyConfig(kind="openai", model="scripted", api="responses")
    policy = PolicyClient(config, scripted.url, api_key="secret")
    try:
        await policy.complete(PolicyRequest(conversation()))
    finally:
        await policy.close()
    (body,) = scripted.bodies
    message, _, output = body["input"]
    assert message["content"][1] == {
        "type": "input_image",
        "image_url": data_url(RED),
        "detail": "auto",
    }
    assert output["type"] == "function_call_output"
    assert [p["type"] for p in output["output"]] == ["input_text", "input_image"]
    assert body_images(body) == [RED, BLUE]


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (12, 12), "green").save(buffer, format="JPEG")
    return buffer.getvalue()


def nemo_gym_image_rows() -> list[dict[str, Any]]:
    """Rows of the shapes of NeMo Gym 0.7.0's image datasets (circle_count, gui_coordinate,
    image_tools): an input_image item with a data URL beside the question."""
    image = {"type": "input_image", "image_url": data_url(RED), "detail": "auto"}
    photo = {"type": "input_image", "image_url": data_url(jpeg()), "detail": "auto"}
    question = {"type": "input_text", "text": "How many red circles?"}
    return [
        {
            "responses_create_params": {
                "input": [
                    {"role": "system", "content": "Count the circles."},
                    {"role": "user", "content": [image, question]},
                ]
            },
            "expected_count": 1,
        },
        {
            "responses_create_params": {
                "input": [{"role": "user", "type": "message", "content": [photo, question]}]
            },
            "bbox": [0, 0, 10, 10],
        },
        {
            "agent_ref": {"type": "responses_api_agents", "name": "image_tools_pivot_agent"},
            "responses_create_params": {
                "input": [
                    {"role": "system", "type": "message", "content": "Use the tools."},
                    {"role": "user", "content": [question, photo, image]},
                ],
                "metadata": {"note": "x"},
            },
        },
    ]


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_nemo_gym_image_rows_are_read_and_their_images_reach_the_policy(
    tmp_path, scripted, api
):
    rows = nemo_gym_image_rows()
    path = tmp_path / "example.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tasks = list(read_tasks(path, default_environment="nemo_gym"))
    assert [task.fields for task in tasks] == rows
    config = PolicyConfig(kind="openai", model="scripted", api=api)
    policy = PolicyClient(config, scripted.url, api_key="secret")
    try:
        for task in tasks:
            await policy.complete(PolicyRequest(task.prompt))
    finally:
        await policy.close()
    assert [body_images(body) for body in scripted.bodies] == [
        [RED],
        [jpeg()],
        [jpeg(), RED],
    ]


def test_audio_parts_stay_refused_by_name():
    content = [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]
    row = {"responses_create_params": {"input": [{"role": "user", "content": content}]}}
    with pytest.raises(InvalidTaskError, match="NeMo Gym feature not supported: audio input"):
        parse_task_row(row, default_environment="nemo_gym")


def test_a_program_may_send_images_through_the_gateway_in_chat_form():
    from rayrollout.agentkit.openai_shapes import BadRequest, chat_messages

    image = {"type": "image_url", "image_url": {"url": data_url(RED)}}
    (message,) = chat_messages(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]
    )
    assert shown(message) == [RED] and message.content == "hi"
    # Text parts alone still read as text, as before.
    (plain,) = chat_messages([{"role": "user", "content": [{"type": "text", "text": "a"}]}])
    assert plain.content == "a" and plain.parts is None
    bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}
    with pytest.raises(BadRequest) as caught:
        chat_messages([{"role": "user", "content": [bad]}])
    assert caught.value.param == "messages[0]" and "base64" in str(caught.value)


IMAGE_ID, END_ID = 1000, 1001  # the character-level test template's image and end tokens


async def char_template(body: dict[str, Any]) -> list[int]:
    """A ChatML-like template, one token per character: an image part is one IMAGE_ID (as a
    vision model's template writes one image token), a turn ends with END_ID."""

    def chars(text: str) -> list[int]:
        return [ord(c) for c in text]

    ids: list[int] = []
    for message in body["messages"]:
        ids += chars(f"<{message['role']}>")
        content = message.get("content")
        for part in content if isinstance(content, list) else [content]:
            if isinstance(part, dict):
                ids += chars(part["text"]) if part["type"] == "text" else [IMAGE_ID]
            elif part:
                ids += chars(part)
        for call in message.get("tool_calls") or []:
            ids += chars(json.dumps(call["function"]))
        ids.append(END_ID)
    if body["add_generation_prompt"]:
        ids += chars("<assistant>")
    return ids


async def test_token_ids_mode_sends_images_with_the_kept_ids_to_the_token_route():
    """With images, ``prompt_mode: token_ids`` posts the ids as rendered (one image token per
    image) and every image so far to ``/inference/v1/generate``; the turn records the ids
    the server expanded, and the next call extends the ids it sent, not the expanded ones."""
    from aiohttp import web

    from rayrollout.policy.tokens import DeltaRenderer

    bodies: list[dict[str, Any]] = []

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        expanded: list[int] = []
        for token in body["token_ids"]:  # each image becomes three placeholder tokens
            expanded += [7, IMAGE_ID, 7] if token == IMAGE_ID else [token]
        choice = {
            "index": 0,
            "text": "done",
            "token_ids": [100, 111, END_ID],
            "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in (100, 111, 1)]},
            "finish_reason": "stop",
        }
        return web.json_response({"prompt_token_ids": expanded, "choices": [choice]})

    config = PolicyConfig(kind="openai", model="m", prompt_mode="token_ids", tokenizer="none")
    messages = conversation()
    async with served_routes({"/inference/v1/generate": generate}) as base_url:
        policy = PolicyClient(config, base_url)
        policy._delta_renderer = DeltaRenderer(char_template)
        try:
            first = await policy.complete(PolicyRequest(messages[:1]))
            second = await policy.complete(PolicyRequest(messages, history=[first.turn]))
        finally:
            await policy.close()

    sent_1, sent_2 = bodies[0]["token_ids"], bodies[1]["token_ids"]
    assert sent_1.count(IMAGE_ID) == 1 and sent_2.count(IMAGE_ID) == 2
    assert [len(b["content_parts"]) for b in bodies] == [1, 2]
    assert [p["url"] for p in bodies[1]["content_parts"]] == [data_url(RED), data_url(BLUE)]
    # The next call extends the ids as sent; the turns hold the expanded ones.
    assert sent_2[: len(sent_1) + 3] == sent_1 + [100, 111, END_ID]
    turn_1, turn_2 = first.turn, second.turn
    assert len(turn_1.prompt_token_ids) == len(sent_1) + 2
    assert turn_2.prompt_token_ids[: len(turn_1.prompt_token_ids) + 3] == (
        turn_1.prompt_token_ids + turn_1.completion_token_ids
    )
    assert turn_1.logprobs == [-0.5] * 3 and first.message.content == "done"


def test_parts_written_before_images_existed_still_read(tmp_path):
    import pyarrow as pa

    from rayrollout.data.run_folder import RunFolder
    from rayrollout.data.schema import trajectory_arrow_schema

    def without_images(data_type: pa.DataType) -> pa.DataType:
        """The type as it was: message structs without 'parts' (anywhere in it)."""
        if pa.types.is_list(data_type):
            return pa.list_(without_images(data_type.value_type))
        if pa.types.is_struct(data_type):
            names = [f.name for f in data_type]
            if "tool_call_id" in names:  # a message
                return pa.struct([f for f in data_type if f.name != "parts"])
            return pa.struct([f.with_type(without_images(f.type)) for f in data_type])
        return data_type

    schema = trajectory_arrow_schema()
    old = pa.schema([f.with_type(without_images(f.type)) for f in schema if f.name != "images"])
    text = Trajectory(
        task_id="old",
        sample_index=0,
        group_id="g",
        environment="e",
        messages=[Message(role="user", content="hi"), Message(role="assistant", content="yo")],
        turns=[Turn(sent_messages=[Message(role="user", content="hi")])],
    )
    row = text.to_row()
    row.pop("images")
    for message in [*row["messages"], *row["turns"][0]["sent_messages"]]:
        message.pop("parts")
    write(ParquetSink, tmp_path, [episode(1)])  # a part of now
    folder = tmp_path / "parquet"
    pq.write_table(pa.Table.from_pylist([row], schema=old), folder / "part-a-00000.parquet")
    read = sorted(RunFolder(folder).trajectories(), key=lambda t: t.task_id)
    assert [t.task_id for t in read] == ["old", "t"]
    assert read[0] == text and read[1].messages == episode(1).messages


def test_show_names_where_each_image_is_kept():
    from rayrollout.cli.show import image_lines

    message = Message(
        role="user",
        content=[
            {"type": "image_url", "image_url": data_url(RED)},
            {"type": "image_url", "image_url": "https://example.com/a.png"},
        ],
    )
    parquet, url = image_lines(message, "parquet")
    assert parquet.startswith("image 1: 24x16 image/png, ") and "images column" in parquet
    assert (
        url
        == "image 2: https://example.com/a.png  (a URL: not stored, the policy server fetches it)"
    )
    assert image_lines(message, "jsonl")[0].endswith("inline data URL in the row")


def test_the_verl_export_refuses_a_prompt_with_images_by_row():
    from rayrollout.data.export.base import ExportError
    from rayrollout.data.export.verl import verl_row

    with pytest.raises(ExportError, match="task 't' sample 0.*shows images"):
        verl_row(episode(1), 0)


def test_nemo_gym_shapes_carry_images_as_input_image_items():
    from rayrollout.data.responses import episode_response, responses_create_params

    trajectory = episode(1)
    task = Task(task_id="t", environment="e", prompt=trajectory.messages[:1])
    (item,) = responses_create_params(task)["input"]
    assert item["content"][1] == {
        "type": "input_image",
        "image_url": data_url(RED),
        "detail": "auto",
    }
    output = episode_response(task, trajectory.messages)["output"]
    (result,) = [o for o in output if o["type"] == "function_call_output"]
    assert [p["type"] for p in result["output"]] == ["input_text", "input_image"]
