"""Export stage: one ``torch.export`` program with the contract of harness/program.py, a dynamic
sequence dimension, the KV cache as buffers.

The ``hf`` path wraps transformers' ``TorchExportableModuleWithHybridCache``, which registers every
cache layer's keys, values and write counter as module buffers (not lifted constants: the
deployment log's "Constant ... lifted_tensor_0 is mutated" lowering failure) and gives sliding
layers a full-length cache, so generation past the sliding window is exact. The attention mask is
built inside the program from the cache position: at a decode step at position p it admits exactly
p + 1 slots (full layers) or min(p + 1, window) slots (sliding layers), so no caller can pass the
log's 1-element mask. The ``fast`` path is harness/export/fast (ExecuTorch's custom ops), with the
same signature.

``strict=True``: with ``strict=False`` torch 2.13 exports, but ``run_decompositions`` (called by
``to_edge_transform_and_lower``) fails with "expected compiled_fn to be GraphModule".
"""

from __future__ import annotations

from harness.errors import HarnessError
from harness.program import ExportSettings, dynamic_shapes, example_inputs

EXPORT_PATHS = ("hf", "fast")


def make_wrapper(model, settings: ExportSettings, export: str = "hf"):
    """The eager module that gets exported: same forward, same cache, runnable eagerly. ``export``
    is the recipe's export path (``Recipe.export``)."""
    if export == "fast":
        from harness.export.fast.decoder import make_fast_wrapper

        return make_fast_wrapper(model, settings.max_context)
    if export != "hf":
        raise HarnessError(f"unknown export path {export!r}", f"use one of {', '.join(EXPORT_PATHS)} (fix recipes.py)")
    from transformers.integrations.executorch import TorchExportableModuleWithHybridCache

    model.requires_grad_(False)
    return TorchExportableModuleWithHybridCache(model, batch_size=1, max_cache_len=settings.max_context).eval()


def export_program(model, settings: ExportSettings, export: str = "hf"):
    import torch

    wrapper = make_wrapper(model, settings, export)
    with torch.no_grad():
        return torch.export.export(wrapper, args=(), kwargs=example_inputs(),
                                   dynamic_shapes=dynamic_shapes(settings), strict=True)
