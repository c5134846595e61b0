"""TRL 1.16 reads rayrollout's vision exports with its own data utilities: in TRL's venv,
``datasets`` loads the ``sft`` and ``dpo`` Parquet files (the ``images`` column as a list of
images), ``prepare_multimodal_messages`` puts each picture in its placeholder, and the vision
collators of ``SFTTrainer`` and ``DPOTrainer`` batch the rows through an offline-built
Idefics3 processor (``trl_vision_driver``). The pictures come back with the very pixels the
episodes showed, in the places they showed them."""

from __future__ import annotations

import pytest
from checks import run_driver, trainer_python
from exports import math_trajectory, write_parts
from test_export_trl_vision import BLUE, GREEN, RED, image_episode

from rayrollout.data.export import export_run

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(600)]


def test_trl_reads_the_vision_exports_with_its_own_data_utilities(tmp_path):
    trainer_python("trl")  # skipped at once where the venv is missing
    sft_run = write_parts(
        tmp_path / "sft-run",
        [image_episode("s", 0, 1.0, "3"), math_trajectory("m", 0, 1.0, "42")],
        fmt="parquet",
    )
    export_run("sft", sft_run, tmp_path / "sft.parquet")
    dpo_run = write_parts(
        tmp_path / "dpo-run",
        [
            image_episode("s", 0, 1.0, "3", later=False),
            image_episode("s", 1, 0.0, "4", later=False),
        ],
        fmt="parquet",
    )
    export_run("dpo", dpo_run, tmp_path / "dpo.parquet")
    pictures = []
    for name, data in (("red", RED), ("blue", BLUE), ("green", GREEN)):
        (tmp_path / f"{name}.png").write_bytes(data)
        pictures.append(str(tmp_path / f"{name}.png"))
    out = tmp_path / "trl-vision.json"
    record = run_driver(
        "trl",
        "trl_vision_driver.py",
        tmp_path / "sft.parquet",
        tmp_path / "dpo.parquet",
        ",".join(pictures),
        out,
        out=out,
    )
    assert record["sft_features"] == "List(Image(mode=None, decode=True))"
    # Each picture, found by its pixels, where the episode showed it.
    assert record["sft"]["s"] == [
        ["text:Count shapes."],
        ["image:0", "text:How many shapes in both?", "image:1"],
        [],  # the tool call
        ["text:3"],
        ["text:3 shapes."],
        ["text:And here?", "image:2"],
        ["text:1."],
    ]
    assert record["sft"]["m"][1] == ["text:What is 6 * 7? (m)"]  # no image put in a text row
    batch = record["sft_batch"]
    assert batch["global_images"][batch["task_ids"].index("s")] == 3
    assert batch["global_images"][batch["task_ids"].index("m")] == 0
    assert batch["pixel_values_equal"] is True
    assert record["dpo_prompt"] == [
        ["text:Count shapes."],
        ["image:0", "text:How many shapes in both?", "image:1"],
    ]
    # The prompt's two pictures, once for the chosen and once for the rejected sequence.
    assert record["dpo_batch"] == {"global_images": [2, 2], "pixel_values_equal": True}
