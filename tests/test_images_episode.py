"""Images through a real run: a prompt showing a picture, a tool returning one, the scripted
policy on Ray, the run's Parquet parts holding each image once, and ``show`` naming them."""

from __future__ import annotations

import io
import json
import re

import pyarrow.parquet as pq
import pytest
from image_envs import picture
from rich.console import Console
from test_report import chromium, needs_chromium
from trajectories import greeting, write_through

from rayrollout.api.rollout_engine import RolloutEngine
from rayrollout.cli.report import render_report
from rayrollout.cli.show import render_trajectory
from rayrollout.data.images import data_url, decode_data_url, image_digest


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def task(i: int) -> dict:
    replies = [
        {"tool": "zoom", "arguments": {"x": 4, "y": 4}},
        {"tool": "zoom", "arguments": {"x": 0, "y": 0}},
        "blue",
    ]
    text = f"What colour is the block? [[replies={json.dumps(replies)}]]"
    content = [
        {"type": "image_url", "image_url": {"url": data_url(png(picture(i)))}},
        {"type": "text", "text": text},
    ]
    return {
        "task_id": f"pic-{i}",
        "environment": "zoom",
        "seed": i,
        "prompt": [{"role": "user", "content": content}],
    }


@pytest.fixture(scope="module")
def image_run(ray_session, tmp_path_factory):
    """Three episodes of ZoomEnv by the scripted policy: ``(output folder, trajectories)``."""
    out = tmp_path_factory.mktemp("image-run") / "out"
    config = {
        "namespace": "images-episode",
        "policy": {"scripted": {"hosting": "actor"}},
        "environments": {"zoom": {"path": "image_envs:ZoomEnv"}},
        "output": {"dir": str(out)},
    }
    with RolloutEngine(config) as engine:
        engine.start()
        result = engine.collect([task(i) for i in range(3)])
        trajectories = sorted(result.trajectories(), key=lambda t: t.task_id)
    return out, trajectories


def test_a_run_shows_images_to_the_policy_and_stores_each_once(image_run):
    out, trajectories = image_run
    assert [t.status for t in trajectories] == ["ok"] * 3, [t.error for t in trajectories]
    for i, trajectory in enumerate(trajectories):
        prompt, _, first, _, second, answer = trajectory.messages
        assert decode_data_url(prompt.images[0].url)[1] == png(picture(i))
        crops = [decode_data_url(m.images[0].url)[1] for m in (first, second)]
        expected = [
            png(picture(i).crop(box).resize((64, 64))) for box in ((4, 4, 20, 20), (0, 0, 16, 16))
        ]
        assert crops == expected
        assert answer.content == "blue" and trajectory.reward == 1.0
        # Three model calls, each sent the picture again: 1, 2, then 3 images.
        assert [t.prompt_message_count for t in trajectory.turns] == [1, 3, 5]
    rows = [
        row
        for part in sorted(out.glob("part-*.parquet"))
        for row in pq.read_table(part).to_pylist()
    ]
    for row in rows:
        stored = {image["sha256"] for image in row["images"]}
        assert len(row["images"]) == len(stored) == 3  # the picture and two crops, once each
        refs = [
            p["sha256"] for m in row["messages"] for p in m["parts"] or [] if p["type"] == "image"
        ]
        assert set(refs) == stored and all(
            p["url"] is None for m in row["messages"] for p in m["parts"] or []
        )

    console = Console(record=True, width=200)
    render_trajectory(trajectories[0], console, "parquet")
    text = console.export_text()
    digest = image_digest(png(picture(0)))[:12]
    assert "image 1: 32x32 image/png" in text and digest in text
    assert "64x64 image/png" in text and "stored once in the row's images column" in text


# After the page loads, the body names each thumbnail's decoded size: what Chromium drew.
_SIZES = (
    "<script>window.addEventListener('load', () => document.body.dataset.thumbs = "
    "[...document.querySelectorAll('img.thumb')]"
    ".map(i => i.naturalWidth + 'x' + i.naturalHeight).join(','));</script>"
)


@needs_chromium
def test_the_report_lists_episodes_with_thumbnails_that_chromium_draws(image_run, tmp_path):
    out, trajectories = image_run
    page = render_report(out)
    assert page.count('class="thumb"') == 3 * 3  # the slowest list: 3 episodes, 3 images each
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", _SIZES + "</body>"))
    dom, stderr = chromium(tmp_path, path, "--dump-dom")
    sizes = re.search(r'data-thumbs="([^"]*)"', dom)
    assert sizes is not None, stderr[-2000:]
    # Each episode: the 32x32 picture at its own size, its two 64x64 crops shrunk to 96 px.
    assert sizes.group(1).split(",") == ["32x32", "64x64", "64x64"] * 3
    assert [line for line in stderr.splitlines() if "CONSOLE" in line] == []


def test_a_text_only_report_has_no_images_column(tmp_path):
    from rayrollout.data.writer import ParquetSink

    write_through(ParquetSink(tmp_path / "out", "run"), [greeting()], 10)
    page = render_report(tmp_path / "out")
    assert "thumb" not in page.split("</style>")[1] and ">images<" not in page
