"""NeMo Gym 0.7.0's five image datasets, read from its wheel, their images reaching the policy.

``circle_click``, ``circle_count``, ``gui_coordinate``, ``image_tools`` and ``vlm_eval_kit``
show the model an image (a Responses ``input_image`` item holding a data URL) beside the
question. Each row's prompt is sent by rayrollout's policy client to the scripted policy's
own server, in both OpenAI APIs, and the request the server received holds every image of
the row, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from recording_policy import TOKEN, body_images, recording_scripted_policy

from rayrollout.data.config import PolicyConfig
from rayrollout.data.images import decode_data_url
from rayrollout.data.tasks import read_tasks
from rayrollout.policy.call import PolicyRequest
from rayrollout.policy.client import PolicyClient

IMAGE_DATASETS = ("circle_click", "circle_count", "gui_coordinate", "image_tools", "vlm_eval_kit")


def row_images(row: dict[str, Any]) -> list[bytes]:
    """The bytes of every input_image of a row's prompt, in order."""
    return [
        decode_data_url(part["image_url"])[1]
        for item in row["responses_create_params"]["input"]
        if isinstance(item.get("content"), list)
        for part in item["content"]
        if part.get("type") == "input_image"
    ]


@pytest.mark.parametrize("name", IMAGE_DATASETS)
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_image_dataset_is_read_and_its_images_reach_the_policy(ng_src: Path, name, api):
    path = ng_src / "resources_servers" / name / "data" / "example.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tasks = list(read_tasks(path, default_environment="nemo_gym"))
    assert len(tasks) == len(rows) == 5
    async with recording_scripted_policy() as server:
        config = PolicyConfig(kind="openai", model="scripted", api=api)
        policy = PolicyClient(config, server.url, api_key=TOKEN)
        try:
            for task in tasks:
                await policy.complete(PolicyRequest(task.prompt, tools=task.tools or []))
        finally:
            await policy.close()
    for row, task, body in zip(rows, tasks, server.bodies, strict=True):
        expected = row_images(row)
        assert expected, f"{name}: a row without an image"
        assert body_images(body) == expected
        assert task.fields == row  # the row goes back to the resources server as it is
