"""Image storage: Parquet size and write time, each image once per row against once per message.

Episodes that each show a 100 KB PNG (random pixels, so it does not compress) in 6 turns:
the prompt and 5 tool results, with a model call after each. The rows are written as the
run's Parquet sink writes them (zstd, parts of ``--rows-per-part``), twice:

* ``once_per_row``: ``Trajectory.to_row`` as rayrollout writes it, the image's bytes once
  in the row's ``images`` column, the 6 parts referring to it by sha256;
* ``every_message``: the same rows with the image as a data URL in each of the 6 parts
  (``schema.inline_images``, the JSONL form), as a store without references would keep it.

Two runs of that: ``image_per_episode``, each episode its own picture (a task set of
different pictures), and ``one_image_for_the_run``, every episode the same picture. Reported
for each form: the parts' bytes; the Arrow tables' bytes before they are written (what a
worker hands the writer, and what the writer buffers); the seconds to turn trajectories into
rows and write them, and to read them back; and whether reading the parts back gives the
very messages that were written.

    python benchmarks/image_storage.py            # 1,000 episodes
    python benchmarks/image_storage.py --smoke    # 100 episodes
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from common import emit  # noqa: E402
from PIL import Image  # noqa: E402
from result_files import run_benchmark  # noqa: E402

from rayrollout.data.images import data_url  # noqa: E402
from rayrollout.data.schema import (  # noqa: E402
    Message,
    ToolCall,
    Trajectory,
    Turn,
    inline_images,
    trajectory_arrow_schema,
)

TURNS = 6


def noise_png(target_bytes: int, seed: int = 0) -> bytes:
    """A PNG of random pixels close to ``target_bytes`` (random pixels barely compress)."""
    rng = random.Random(seed)
    side = int((target_bytes / 3) ** 0.5)
    image = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def episode(i: int, url: str) -> Trajectory:
    """An episode showing the image in the prompt and in 5 tool results: 6 model calls."""
    image = {"type": "image_url", "image_url": {"url": url}}
    messages = [Message(role="user", content=[{"type": "text", "text": f"Task {i}."}, image])]
    turns = []
    for t in range(TURNS - 1):
        turns.append(Turn(prompt_message_count=len(messages), completion_tokens=8))
        call = ToolCall.model_validate(
            {"id": f"c{t}", "function": {"name": "zoom", "arguments": '{"x": 0, "y": 0}'}}
        )
        messages.append(Message(role="assistant", tool_calls=[call]))
        messages.append(
            Message(
                role="tool",
                tool_call_id=f"c{t}",
                content=[{"type": "text", "text": f"zoom {t}"}, image],
            )
        )
    turns.append(Turn(prompt_message_count=len(messages), completion_tokens=2))
    messages.append(Message(role="assistant", content="3"))
    return Trajectory(
        task_id=f"img-{i}",
        sample_index=0,
        group_id=f"img-{i}",
        environment="shapes",
        messages=messages,
        turns=turns,
    )


def write(
    trajectories: list[Trajectory], folder: Path, rows_per_part: int, inline: bool
) -> dict[str, Any]:
    """Rows written as Parquet parts; their bytes, the seconds taken, and the round trip."""
    folder.mkdir(parents=True)
    schema = trajectory_arrow_schema()
    arrow_bytes = 0
    started = time.perf_counter()
    for start in range(0, len(trajectories), rows_per_part):
        rows = [t.to_row() for t in trajectories[start : start + rows_per_part]]
        if inline:
            rows = [inline_images(row) for row in rows]
        table = pa.Table.from_pylist(rows, schema=schema)
        arrow_bytes += table.nbytes
        pq.write_table(
            table, folder / f"part-{start // rows_per_part:05d}.parquet", compression="zstd"
        )
    seconds = time.perf_counter() - started
    parts = sorted(folder.glob("*.parquet"))
    started = time.perf_counter()
    back = [Trajectory.from_row(row) for part in parts for row in pq.read_table(part).to_pylist()]
    read_seconds = time.perf_counter() - started
    return {
        "parquet_bytes": sum(p.stat().st_size for p in parts),
        "arrow_bytes": arrow_bytes,
        "parts": len(parts),
        "write_seconds": round(seconds, 3),
        "read_seconds": round(read_seconds, 3),
        "round_trip_identical": [t.messages for t in back] == [t.messages for t in trajectories],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="100 episodes")
    parser.add_argument("--episodes", type=int, default=None)
    parser.add_argument("--image-kb", type=int, default=100)
    parser.add_argument("--rows-per-part", type=int, default=250)
    args = parser.parse_args()
    episodes = args.episodes or (100 if args.smoke else 1_000)
    results: dict[str, Any] = {}
    for scenario in ("image_per_episode", "one_image_for_the_run"):
        shared = data_url(noise_png(args.image_kb * 1024))
        trajectories = [
            episode(
                i,
                shared
                if scenario == "one_image_for_the_run"
                else data_url(noise_png(args.image_kb * 1024, seed=i + 1)),
            )
            for i in range(episodes)
        ]
        with tempfile.TemporaryDirectory() as tmp:
            once = write(trajectories, Path(tmp) / "once", args.rows_per_part, inline=False)
            every = write(trajectories, Path(tmp) / "every", args.rows_per_part, inline=True)
        results[scenario] = {
            "once_per_row": once,
            "every_message": every,
            "size_ratio": round(every["parquet_bytes"] / once["parquet_bytes"], 2),
            "arrow_size_ratio": round(every["arrow_bytes"] / once["arrow_bytes"], 2),
            "write_time_ratio": round(every["write_seconds"] / once["write_seconds"], 2),
        }
        del trajectories
    emit(
        {
            "benchmark": "image_storage",
            "episodes": episodes,
            "image_bytes": len(noise_png(args.image_kb * 1024)),
            "images_shown_per_episode": TURNS,
            "rows_per_part": args.rows_per_part,
            **results,
        }
    )


if __name__ == "__main__":
    run_benchmark(main)
