"""Shapes environment: the pictures answer the questions, zoom returns an image, the verifier."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from rayrollout.data.images import decode_data_url
from rayrollout.data.schema import FunctionCall, Message, ToolCall
from rayrollout.data.tasks import read_tasks
from rayrollout.environments.shapes.env import COLOURS, SIZE, ShapesEnv, draw, layout, task_row
from rayrollout.envkit import Episode
from rayrollout.envkit.sessions import InlineSession

HERE = Path(__file__).resolve().parents[1]


def shipped() -> list:
    return list(read_tasks(HERE / "tasks.jsonl"))


def prompt_picture(task) -> Image.Image:
    (image,) = task.prompt[0].images
    return Image.open(io.BytesIO(decode_data_url(image.url)[1])).convert("RGB")


def test_the_shipped_tasks_are_the_rows_task_row_writes():
    tasks = shipped()
    assert len(tasks) == 8
    for task in tasks:
        row = task_row(task.fields["seed"])
        assert task.task_id == row["task_id"] and task.fields["count"] == row["count"]


def test_the_answer_is_in_the_picture_and_not_in_the_text():
    for task in shipped():
        picture = prompt_picture(task)
        assert list(picture.getdata()) == list(draw(task.fields["seed"]).getdata())
        assert str(task.fields["count"]) not in (task.prompt[0].content or "")
        # The count is what the picture shows: one shape of each kind per cell of the grid.
        colour, kind = task.fields["colour"], task.fields["kind"]
        shown = [s for s in layout(task.fields["seed"]) if s[:2] == (colour, kind)]
        assert len(shown) == task.fields["count"]
        for _, _, column, row in shown:
            centre = picture.getpixel((column * 64 + 32, row * 64 + 40))
            assert centre == COLOURS[colour]


async def test_zoom_returns_an_enlarged_crop_of_the_picture():
    task = shipped()[0]
    result = await ShapesEnv(task).call_tool(
        "zoom", json.dumps({"x": 64, "y": 0, "width": 64, "height": 32})
    )
    assert not result.is_error and result.parts is not None
    (part,) = result.parts
    crop = Image.open(io.BytesIO(decode_data_url(part.url or "")[1])).convert("RGB")
    assert crop.size == (128, 64)
    expected = draw(task.fields["seed"]).crop((64, 0, 128, 32)).resize((128, 64))
    assert list(crop.getdata()) == list(expected.getdata())


@pytest.mark.parametrize(
    "region",
    [{"x": -1, "y": 0, "width": 10, "height": 10}, {"x": 0, "y": 0, "width": 0, "height": 5}],
)
async def test_zoom_outside_the_picture_is_an_error_the_model_reads(region):
    result = await ShapesEnv(shipped()[0]).call_tool("zoom", json.dumps(region))
    assert result.is_error and f"{SIZE}x{SIZE}" in result.content


async def test_the_verifier_rewards_the_right_count_only():
    task = shipped()[0]
    count = task.fields["count"]
    env = ShapesEnv(task)
    right = Episode(
        task=task, messages=[*task.prompt, Message(role="assistant", content=f"{count}")]
    )
    wrong = Episode(
        task=task, messages=[*task.prompt, Message(role="assistant", content=f"{count + 1}")]
    )
    assert (await env.verify(right)).reward == 1.0
    assert (await env.verify(wrong)).reward == 0.0


async def test_an_inline_session_plays_zoom_then_answers():
    task = shipped()[0]
    session = InlineSession(ShapesEnv, task)
    await session.setup()
    try:
        result = await session.call_tool("zoom", '{"x": 0, "y": 0, "width": 128, "height": 128}')
        call = ToolCall(id="c1", function=FunctionCall(name="zoom", arguments="{}"))
        messages = [
            *task.prompt,
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", content=result.content, parts=result.parts),
            Message(role="assistant", content=str(task.fields["count"])),
        ]
        verdict = await session.verify(Episode(task=task, messages=messages))
    finally:
        await session.close()
    assert len(messages[2].images) == 1 and verdict.reward == 1.0
