"""``export sft``/``dpo`` of episodes that show images, in TRL's vision form, and ``export
nemo-gym`` of the same run: read back from the files as their trainers read them.

The run is written through the project's own sink and part writer (Parquet parts store each
image once per row, by digest); the export must give back the very pictures, in the order
of their ``{"type": "image"}`` placeholders.
"""

import io
import json

import pyarrow.parquet as pq
import pytest
from exports import CALCULATOR, invoke, load, math_trajectory, write_parts
from PIL import Image

from rayrollout.data.export import export_run
from rayrollout.data.export.base import ExportError
from rayrollout.data.images import data_url, decode_data_url
from rayrollout.data.schema import EpisodeMetrics, FunctionCall, Message, ToolCall, Trajectory


def png(color, size):
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


RED, BLUE, GREEN = png("red", (24, 16)), png("blue", (8, 8)), png("green", (5, 7))


def image_episode(task_id, sample_index, reward, answer, tool_image=False, later=True):
    """Two pictures in the prompt around the question, a calculator call, and (``later``) a
    third picture in a later user message; the tool result shows GREEN when ``tool_image``."""
    call = ToolCall(
        id=f"call_{sample_index}",
        function=FunctionCall(name="calculator", arguments='{"expression": "2 + 1"}'),
    )
    tool_content = (
        [{"type": "text", "text": "3"}, {"type": "image_url", "image_url": data_url(GREEN)}]
        if tool_image
        else "3"
    )
    later_turn = _later_turn() if later else []
    return Trajectory(
        task_id=task_id,
        sample_index=sample_index,
        group_id=task_id,
        environment="shapes",
        model="scripted",
        reward=reward,
        status="ok",
        tools=[CALCULATOR],
        messages=[
            Message(role="system", content="Count shapes."),
            Message(
                role="user",
                content=[
                    {"type": "image_url", "image_url": {"url": data_url(RED), "detail": "low"}},
                    {"type": "text", "text": "How many shapes in both?"},
                    {"type": "image_url", "image_url": data_url(BLUE)},
                ],
            ),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id=call.id, name="calculator", content=tool_content),
            Message(role="assistant", content=f"{answer} shapes."),
            *later_turn,
        ],
        metrics=EpisodeMetrics(turns=3 if later else 2, tool_calls=1, tokens_in=30, tokens_out=12),
    )


def _later_turn():
    return [
        Message(
            role="user",
            content=[
                {"type": "text", "text": "And here?"},
                {"type": "image_url", "image_url": data_url(GREEN)},
            ],
        ),
        Message(role="assistant", content="1."),
    ]


def pixels(image):
    return image.convert("RGB").tobytes(), image.size


def same_picture(image, data):
    """``image`` (as ``datasets`` decodes it) shows exactly the picture of PNG ``data``."""
    return pixels(image) == pixels(Image.open(io.BytesIO(data)))


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_sft_rows_with_images_take_trls_vision_form(tmp_path, fmt):
    run = write_parts(
        tmp_path / "run",
        [image_episode("s", 0, 1.0, "3"), math_trajectory("m", 0, 1.0, "42")],
        fmt=fmt,
    )
    out = tmp_path / "sft.parquet"
    code, output = invoke("export", "sft", run, out)
    assert code == 0, output
    assert pq.read_schema(out).field("images").type.value_type.names == ["bytes", "path"]
    rows = {row["task_id"]: row for row in load(out)}
    vision, text = rows["s"], rows["m"]
    # Every content is a list of parts (a string would make TRL put all the images in it).
    assert [m.get("content") for m in vision["messages"]] == [
        [{"type": "text", "text": "Count shapes."}],
        [
            {"type": "image"},
            {"type": "text", "text": "How many shapes in both?"},
            {"type": "image"},
        ],
        None,
        [{"type": "text", "text": "3"}],
        [{"type": "text", "text": "3 shapes."}],
        [{"type": "text", "text": "And here?"}, {"type": "image"}],
        [{"type": "text", "text": "1."}],
    ]
    assert vision["messages"][2]["tool_calls"][0]["function"]["arguments"] == {
        "expression": "2 + 1"
    }
    # datasets decodes the column to Pillow images, in the placeholders' order.
    assert [
        same_picture(i, d) for i, d in zip(vision["images"], [RED, BLUE, GREEN], strict=True)
    ] == [True] * 3
    assert text["images"] == []
    assert text["messages"][1]["content"] == "What is 6 * 7? (m)"  # text rows as before


def test_jsonl_rows_keep_images_as_data_urls_and_text_rows_have_no_images_key(tmp_path):
    run = write_parts(
        tmp_path / "run", [image_episode("s", 0, 1.0, "3"), math_trajectory("m", 0, 1.0, "42")]
    )
    out = tmp_path / "sft.jsonl"
    export_run("sft", run, out)
    rows = {row["task_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert [decode_data_url(u)[1] for u in rows["s"]["images"]] == [RED, BLUE, GREEN]
    assert "images" not in rows["m"]


def test_a_text_only_export_has_no_images_column(tmp_path):
    run = write_parts(tmp_path / "run", [math_trajectory("m", 0, 1.0, "42")], fmt="parquet")
    export_run("sft", run, tmp_path / "sft.parquet")
    assert "images" not in pq.read_schema(tmp_path / "sft.parquet").names
    assert pq.read_schema(tmp_path / "sft.parquet").metadata is None


def test_images_after_the_first_written_batch_still_get_the_column(tmp_path):
    """More text rows than one Parquet batch (256), then an episode with images."""
    episodes = [math_trajectory(f"m{i}", 0, 1.0, "42") for i in range(300)]
    run = write_parts(
        tmp_path / "run",
        [*episodes, image_episode("s", 0, 1.0, "3")],
        fmt="parquet",
        rows_per_part=100,
    )
    summary = export_run("sft", run, tmp_path / "sft.parquet")
    assert (summary.rows_read, summary.rows_written) == (301, 301)
    rows = load(tmp_path / "sft.parquet")
    images = {row["task_id"]: row["images"] for row in rows}
    assert len(images["s"]) == 3 and same_picture(images["s"][1], BLUE)
    assert images["m0"] == [] and images["m299"] == []


def test_a_tool_result_with_an_image_is_refused_by_row(tmp_path):
    run = write_parts(tmp_path / "run", [image_episode("s", 4, 1.0, "3", tool_image=True)])
    with pytest.raises(ExportError, match=r"task 's' sample 4, field 'messages\[3\]'.*tool"):
        export_run("sft", run, tmp_path / "sft.parquet")
    assert not (tmp_path / "sft.parquet").exists()


def test_dpo_pairs_put_the_prompts_images_in_the_images_column(tmp_path):
    run = write_parts(
        tmp_path / "run",
        [
            image_episode("s", 0, 1.0, "3", later=False),
            image_episode("s", 1, 0.0, "4", later=False),
        ],
        fmt="parquet",
    )
    out = tmp_path / "dpo.parquet"
    code, output = invoke("export", "dpo", run, out)
    assert code == 0, output
    (row,) = load(out)
    assert [p["type"] for p in row["prompt"][1]["content"]] == ["image", "text", "image"]
    assert [same_picture(i, d) for i, d in zip(row["images"], [RED, BLUE], strict=True)] == [
        True,
        True,
    ]


def test_dpo_refuses_a_completion_that_shows_images(tmp_path):
    """TRL fills only the prompt's placeholders: the later GREEN picture has no place."""
    run = write_parts(
        tmp_path / "run",
        [image_episode("s", 0, 1.0, "3"), image_episode("s", 1, 0.0, "4")],
        fmt="parquet",
    )
    with pytest.raises(ExportError, match=r"task 's' sample 0, field 'chosen\[3\]'.*prompt"):
        export_run("dpo", run, tmp_path / "dpo.parquet")


def test_nemo_gym_rows_keep_images_as_input_image_items(tmp_path):
    run = write_parts(
        tmp_path / "run",
        [image_episode("s", 0, 1.0, "3", tool_image=True, later=False)],
        fmt="parquet",
    )
    out = tmp_path / "rollouts.jsonl"
    export_run("nemo-gym", run, out)
    (row,) = map(json.loads, out.read_text().splitlines())
    (user,) = [i for i in row["responses_create_params"]["input"] if i.get("role") == "user"]
    assert [p["type"] for p in user["content"]] == ["input_image", "input_text", "input_image"]
    assert user["content"][0] == {
        "type": "input_image",
        "image_url": data_url(RED),
        "detail": "low",
    }
    assert decode_data_url(user["content"][2]["image_url"])[1] == BLUE
    output = row["response"]["output"]
    (result,) = [o for o in output if o["type"] == "function_call_output"]
    assert [p["type"] for p in result["output"]] == ["input_text", "input_image"]
    assert decode_data_url(result["output"][1]["image_url"])[1] == GREEN
