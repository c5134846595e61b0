"""Shapes: a picture of coloured shapes, a question only the picture answers, a zoom tool.

Each task's picture is drawn with Pillow from its ``seed`` (``draw``): circles, squares
and triangles of a few colours on a white canvas, none overlapping. The prompt shows it
(an image part) and asks how many shapes of one colour and kind it holds; the answer is
in no text the model sees. ``zoom`` crops a region of the same picture (drawn again from
the seed) and returns it enlarged, an image tool result. The verifier compares the last
integer of the final answer with the count.

``task_row(seed)`` writes a task row (the picture as a data URL); ``tasks.jsonl`` holds
eight of them.
"""

from __future__ import annotations

import io
import random
import re
from typing import Any, ClassVar

from PIL import Image, ImageDraw

from rayrollout.data.images import data_url
from rayrollout.envkit import Environment, Episode, ToolError, Verification, tool

SIZE = 256
CELL = 64  # shapes sit one per cell of a 4x4 grid, so none overlap
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 60)}
KINDS = ("circle", "square", "triangle")


def layout(seed: int) -> list[tuple[str, str, int, int]]:
    """The picture's shapes as ``(colour, kind, cell column, cell row)``, from the seed."""
    rng = random.Random(seed)
    cells = rng.sample([(c, r) for c in range(SIZE // CELL) for r in range(SIZE // CELL)], 7)
    return [(rng.choice(list(COLOURS)), rng.choice(KINDS), c, r) for c, r in cells]


def draw(seed: int) -> Image.Image:
    """The task's picture: its ``layout`` drawn on a white canvas."""
    image = Image.new("RGB", (SIZE, SIZE), "white")
    pen = ImageDraw.Draw(image)
    for colour, kind, column, row in layout(seed):
        x0, y0 = column * CELL + 12, row * CELL + 12
        x1, y1 = x0 + CELL - 24, y0 + CELL - 24
        fill = COLOURS[colour]
        if kind == "circle":
            pen.ellipse((x0, y0, x1, y1), fill=fill)
        elif kind == "square":
            pen.rectangle((x0, y0, x1, y1), fill=fill)
        else:
            pen.polygon([((x0 + x1) // 2, y0), (x0, y1), (x1, y1)], fill=fill)
    return image


def task_row(seed: int) -> dict[str, Any]:
    """A task row: the picture in the prompt, the question, and the count to verify."""
    shapes = layout(seed)
    colour, kind = shapes[0][0], shapes[0][1]
    count = sum(1 for c, k, _, _ in shapes if (c, k) == (colour, kind))
    buffer = io.BytesIO()
    draw(seed).save(buffer, format="PNG", optimize=True)
    question = (
        f"How many {colour} {kind}s are in the picture? Use zoom to look closer if you need "
        "to, then answer with the number."
    )
    content = [
        {"type": "image_url", "image_url": {"url": data_url(buffer.getvalue())}},
        {"type": "text", "text": question},
    ]
    return {
        "task_id": f"shapes-{seed}",
        "environment": "shapes",
        "prompt": [{"role": "user", "content": content}],
        "seed": seed,
        "colour": colour,
        "kind": kind,
        "count": count,
    }


class ShapesEnv(Environment):
    """Count shapes of one colour and kind in a picture; zoom returns a crop of it."""

    name = "shapes"
    default_hosting = "inline"  # a crop of a 256-pixel picture is well under a millisecond
    needs_vision = True  # the answer is in the picture
    zoom_factor: ClassVar[int] = 2

    @tool
    async def zoom(self, x: int, y: int, width: int, height: int) -> Image.Image:
        """Crop a region of the picture and return it enlarged twice.

        Args:
            x: Left edge of the region, in pixels from the picture's left (0 to 255).
            y: Top edge of the region, in pixels from the picture's top (0 to 255).
            width: Width of the region in pixels.
            height: Height of the region in pixels.
        """
        seed = self.task.fields.get("seed")
        if not isinstance(seed, int):
            raise ToolError("this task has no picture to zoom into (no 'seed' field)")
        if width <= 0 or height <= 0 or not (0 <= x < SIZE and 0 <= y < SIZE):
            raise ToolError(f"the region must lie inside the {SIZE}x{SIZE} picture")
        box = (x, y, min(SIZE, x + width), min(SIZE, y + height))
        crop = draw(seed).crop(box)
        return crop.resize((crop.width * self.zoom_factor, crop.height * self.zoom_factor))

    async def verify(self, episode: Episode) -> Verification:
        """Reward 1.0 when the final answer's last integer is the count."""
        expected = episode.task.fields.get("count")
        numbers = re.findall(r"-?\d+", episode.final_answer())
        answer = int(numbers[-1]) if numbers else None
        reward = float(answer is not None and answer == expected)
        return Verification(reward=reward, details={"answer": answer, "expected": expected})
