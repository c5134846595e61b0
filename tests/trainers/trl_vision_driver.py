"""Run in TRL 1.16's venv: read rayrollout's vision SFT and DPO exports as TRL's vision
trainers do, and write what they got as JSON for ``test_trl_vision``.

``datasets`` loads each Parquet file; ``trl.data_utils.prepare_multimodal_messages`` fills
the placeholders with the ``images`` column (what both vision collators call per row); then
``DataCollatorForVisionLanguageModeling`` (SFT) and ``DataCollatorForVisionPreference`` (DPO)
batch the rows through a processor. The processor is an Idefics3 one built here, offline:
transformers' PIL image processor (no torchvision) and a word-level tokenizer made in code.

Usage: python trl_vision_driver.py SFT_PARQUET DPO_PARQUET PICTURES OUT_JSON, where PICTURES
is a comma-separated list of PNG files, the pictures the SFT vision row shows, in order.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import datasets
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from trl.data_utils import prepare_multimodal_messages
from trl.trainer.dpo_trainer import DataCollatorForVisionPreference
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

IMAGE_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    "<end_of_utterance>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }} "
    "{% elif m['content'] %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image> {% elif p['type'] == 'text' %}{{ p['text'] }} "
    "{% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
)


def processor() -> Any:
    words = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>", *IMAGE_TOKENS]
    words += ["system", "user", "assistant", "tool"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens=IMAGE_TOKENS,
    )
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False
    )
    return transformers.Idefics3Processor(
        image_processor=images, tokenizer=fast, image_seq_len=4, chat_template=TEMPLATE
    )


def pixels(image: Image.Image) -> tuple[bytes, tuple[int, int]]:
    return image.convert("RGB").tobytes(), image.size


def parts(messages: list[dict[str, Any]], pictures: list[Image.Image]) -> list[list[str]]:
    """Each message's parts: ``text:<text>``, or ``image:<i>`` where picture i has the very
    pixels of the filled image (-1: none has)."""
    known = [pixels(p) for p in pictures]
    out = []
    for message in messages:
        row = []
        for part in message.get("content") or []:
            if part["type"] == "image":
                found = pixels(part["image"])
                row.append(f"image:{known.index(found) if found in known else -1}")
            else:
                row.append(f"text:{part['text']}")
        out.append(row)
    return out


def count(ids: torch.Tensor, token: str, proc: Any) -> list[int]:
    token_id = proc.tokenizer.convert_tokens_to_ids(token)
    return [int((row == token_id).sum()) for row in ids]


def main() -> None:
    sft_path, dpo_path, picture_paths, out_path = sys.argv[1:5]
    pictures = [Image.open(p) for p in picture_paths.split(",")]
    proc = processor()
    cache = str(__import__("pathlib").Path(out_path).parent / ".hf-cache")
    record: dict[str, Any] = {}

    sft = datasets.load_dataset("parquet", data_files=sft_path, split="train", cache_dir=cache)
    record["sft_features"] = str(sft.features["images"])
    rows = list(sft)
    record["sft"] = {
        row["task_id"]: parts(prepare_multimodal_messages(row["messages"], row["images"]), pictures)
        for row in rows
    }
    batch = DataCollatorForVisionLanguageModeling(proc)(
        [{"messages": r["messages"], "images": r["images"]} for r in rows]
    )
    want = proc.image_processor(images=[pictures], return_tensors="pt")["pixel_values"]
    vision = [i for i, r in enumerate(rows) if r["images"]]
    record["sft_batch"] = {
        "task_ids": [r["task_id"] for r in rows],
        "global_images": count(batch["input_ids"], "<global-img>", proc),
        "pixel_values_shape": list(batch["pixel_values"].shape),
        # The vision row's pixel values are its pictures', in order, processed as they are.
        "pixel_values_equal": torch.equal(
            batch["pixel_values"][vision[0], : want.shape[1]], want[0]
        ),
    }

    dpo = datasets.load_dataset("parquet", data_files=dpo_path, split="train", cache_dir=cache)
    (pair,) = list(dpo)
    record["dpo_prompt"] = parts(
        prepare_multimodal_messages(pair["prompt"], pair["images"]), pictures
    )
    batch = DataCollatorForVisionPreference(proc)(
        [{k: pair[k] for k in ("prompt", "chosen", "rejected", "images")}]
    )
    want = proc.image_processor(images=[pictures[:2]] * 2, return_tensors="pt")["pixel_values"]
    record["dpo_batch"] = {
        "global_images": count(batch["input_ids"], "<global-img>", proc),
        "pixel_values_equal": torch.equal(batch["pixel_values"], want),
    }
    with open(out_path, "w", encoding="utf-8") as file:
        json.dump(record, file)


if __name__ == "__main__":
    main()
