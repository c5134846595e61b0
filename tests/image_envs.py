"""A test environment whose tool returns an image (imported by actors by module path)."""

from __future__ import annotations

from PIL import Image

from rayrollout.envkit import Environment, Episode, Verification, tool


def picture(seed: int) -> Image.Image:
    """A small picture made from the seed: a coloured block on white."""
    image = Image.new("RGB", (32, 32), "white")
    image.paste((seed * 40 % 256, 90, 200), (4, 4, 20, 20))
    return image


class ZoomEnv(Environment):
    """``zoom`` returns the task's picture cropped and enlarged (a Pillow image)."""

    name = "zoom"

    @tool
    async def zoom(self, x: int, y: int) -> Image.Image:
        """Crop 16x16 pixels at (x, y) and enlarge them to 64x64.

        Args:
            x: Left edge.
            y: Top edge.
        """
        crop = picture(int(self.task.fields.get("seed", 0))).crop((x, y, x + 16, y + 16))
        return crop.resize((64, 64))

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=float(episode.final_answer().strip() == "blue"))
