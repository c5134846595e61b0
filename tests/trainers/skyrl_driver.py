"""Run in SkyRL's own venv (Python 3.12, ``.venv-trainers-skyrl``): SkyRL's
``prepare_generator_input`` -> rayrollout's generator -> SkyRL's
``validate_generator_output``, against a running rollout service.

Usage: ``python skyrl_driver.py URL TOKEN OUT.json``. Writes the generator's output and the
rows the service streamed (``last_sequences``), for the test to compare in rayrollout's venv.
"""

from __future__ import annotations

import asyncio
import json
import sys

from skyrl.train.generators.utils import prepare_generator_input
from skyrl.train.utils.trainer_utils import validate_generator_output

from rayrollout.client import AsyncRolloutClient
from rayrollout.integrations.skyrl import RayrolloutGenerator

CITIES = ["Paris", "Tokyo", "Oslo", "Lima"]
SAMPLES = 4


def main(url: str, token: str, out: str) -> None:
    prompts = [
        {
            "prompt": [{"role": "user", "content": f"What's the weather like in {city}?"}],
            "env_class": "weather",
            "env_extras": {"city": city},
            "uid": f"weather-{city.lower()}",
        }
        for city in CITIES
    ]
    sampling = {"temperature": 1.0, "max_generate_length": 128}
    batch, uids = prepare_generator_input(prompts, SAMPLES, sampling, "weather", "train", 0)
    generator = RayrolloutGenerator(AsyncRolloutClient(url, token=token))
    output = asyncio.run(generator.generate(batch))
    validate_generator_output(len(batch["prompts"]), output)
    record = {
        "uids": uids,
        "trajectory_ids": [[t.instance_id, t.repetition_id] for t in output["trajectory_ids"]],
        "rows": [s.row.model_dump(mode="json") for s in generator.last_sequences],
        **{k: v for k, v in output.items() if k != "trajectory_ids"},
    }
    with open(out, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
