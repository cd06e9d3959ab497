"""Export stage: one ``torch.export`` program, dynamic sequence dimension, KV cache as buffers.

The program is ``forward(input_ids[1, seq], cache_position[seq]) -> logits[1, seq, vocab]`` and
serves both prefill (seq = prompt length) and decode (seq = 1). It wraps transformers'
``TorchExportableModuleWithHybridCache``, which registers every cache layer's keys, values and
write counter as module buffers (not lifted constants: the deployment log's "Constant ...
lifted_tensor_0 is mutated" lowering failure) and gives sliding layers a full-length cache, so
generation past the sliding window is exact. The attention mask is built inside the program from
the cache position: at a decode step at position p it admits exactly p + 1 slots (full layers) or
min(p + 1, window) slots (sliding layers), so no caller can pass the log's 1-element mask.

``strict=True``: with ``strict=False`` torch 2.13 exports, but ``run_decompositions`` (called by
``to_edge_transform_and_lower``) fails with "expected compiled_fn to be GraphModule".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.errors import HarnessError


@dataclass(frozen=True)
class ExportSettings:
    max_context: int = 128  # KV cache slots; positions 0 .. max_context - 1

    @property
    def max_seq(self) -> int:
        """Longest single call (prefill chunk) the program accepts."""
        return self.max_context - 1

    def as_dict(self) -> dict:
        return asdict(self)


def make_wrapper(model, settings: ExportSettings):
    """The eager module that gets exported: same forward, same cache, runnable eagerly. A model
    quantized by a ``fast`` recipe (``harness_export`` set by harness.quantize) gets
    harness/fast.py's wrapper (custom SDPA and KV-cache ops), with the same signature."""
    from transformers.integrations.executorch import TorchExportableModuleWithHybridCache

    if getattr(model, "harness_export", "hf") == "fast":
        from harness.fast import make_fast_wrapper

        return make_fast_wrapper(model, settings.max_context)
    model.requires_grad_(False)
    return TorchExportableModuleWithHybridCache(model, batch_size=1, max_cache_len=settings.max_context).eval()


def example_inputs(n: int = 4):
    import torch

    return {"input_ids": torch.ones(1, n, dtype=torch.long), "cache_position": torch.arange(n)}


def export_program(model, settings: ExportSettings):
    import torch
    from torch.export import Dim

    wrapper = make_wrapper(model, settings)
    seq = Dim("seq", min=1, max=settings.max_seq)
    with torch.no_grad():
        return torch.export.export(
            wrapper,
            args=(),
            kwargs=example_inputs(),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=True,
        )


def check_call(n_tokens: int, start: int, settings: ExportSettings, vocab_size: int, ids=None) -> None:
    """The harness's own guard, before any runtime sees the call."""
    if n_tokens < 1:
        raise HarnessError("empty input: a call needs at least one token", "pass a non-empty prompt")
    if n_tokens > settings.max_seq:
        raise HarnessError(
            f"{n_tokens} tokens in one call exceed the exported maximum of {settings.max_seq} per call "
            f"(context {settings.max_context})",
            "shorten the prompt, or re-export with a larger max_context",
        )
    if start + n_tokens > settings.max_context:
        raise HarnessError(
            f"{start + n_tokens} tokens exceed the exported maximum context of {settings.max_context}",
            "shorten the prompt or --max-new-tokens, or re-export with a larger max_context",
        )
    if ids is not None:
        bad = [int(i) for i in ids if not 0 <= int(i) < vocab_size]
        if bad:
            raise HarnessError(
                f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})",
                "encode the prompt with the model's own tokenizer",
            )
