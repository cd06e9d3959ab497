"""The PyTorch runtimes: ``eager`` (the module that gets exported, run eagerly: transformers'
exportable wrapper, or the fast recipe's decoder) and ``exported`` (the ``torch.export`` program,
as reloaded from its verified ``.pt2``). Both take the program contract's inputs and give
``logits[1, s, V]`` float tensors."""

from __future__ import annotations

import time
from contextlib import contextmanager

from harness.runtimes.base import Runtime, register


@contextmanager
def gathered_embeddings():
    """Quantized embedding lookups that dequantize only the rows looked up. torchao's lookup on an
    ``IntxUnpackedToInt8Tensor`` dequantizes the whole table first: E2B's per-layer table is 2.35B
    entries, 9.4 GB in FP32 per call, which ran eager PyTorch out of a 24 GB machine. Dequantizing
    is elementwise with a scale and zero point per row block, so gathering first gives the same
    floats bit for bit (tests/test_stream_load.py holds it); any other layout goes to torchao's."""
    import torch
    from torchao.quantization import IntxUnpackedToInt8Tensor as Q

    tables = [(getattr(Q, "_TORCH_FN_TABLE", {}).get(Q, {}), torch.nn.functional.embedding),
              (getattr(Q, "_ATEN_OP_TABLE", {}).get(Q, {}), torch.ops.aten.embedding.default)]
    saved = [(table, op, table.get(op)) for table, op in tables if op in table]

    def lookup(original):
        def gather_first(func, types, args, kwargs):
            weight = next((a for a in args[:2] if isinstance(a, Q)), None)
            indices = next((a for a in args[:2] if a is not weight), None)
            extra = [a for a in args[2:] if a not in (None, False, 2.0, -1)] + [v for v in (kwargs or {}).values()
                                                                              if v not in (None, False, 2.0, -1)]
            if weight is None or weight.dim() != 2 or weight.block_size[0] != 1 or extra:
                return original(func, types, args, kwargs)
            flat = indices.reshape(-1)
            rows = Q(weight.qdata[flat], weight.scale[flat], weight.zero_point[flat], weight.target_dtype,
                     (1, weight.block_size[1]), weight.dtype, weight.activation_quantization)
            return rows.dequantize().reshape(*indices.shape, weight.shape[1])
        return gather_first

    for table, op, original in saved:
        table[op] = lookup(original)
    try:
        yield
    finally:
        for table, op, original in saved:
            table[op] = original


def as_long(x):
    import torch

    return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.long)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(int(threads))


@register
class EagerRuntime(Runtime):
    """``artifact``: a model spec (``fixture``, ``bench``, ...) loaded in FP32, or a model object
    (a recipe's quantized model); ``export``: the recipe's export path (``hf`` or ``fast``)."""

    kind = "eager"

    def __init__(self, artifact, threads: int | None = None, settings=None, export: str = "hf"):
        from harness.export.torch_export import make_wrapper
        from harness.program import ExportSettings

        _set_threads(threads)
        t0 = time.perf_counter()
        if isinstance(artifact, str):
            from harness.models.spec import load_model

            model = load_model(artifact).model
        else:
            model = artifact
        self.artifact, self.settings = artifact, settings or ExportSettings()
        self.wrapper = make_wrapper(model, self.settings, export)
        self.max_context, self.vocab_size = self.settings.max_context, int(model.config.vocab_size)
        self.load_s = time.perf_counter() - t0

    def step(self, ids, positions):
        import torch

        with torch.no_grad(), gathered_embeddings():
            return self.wrapper(input_ids=as_long([ids] if isinstance(ids, list) else ids),
                                cache_position=as_long(positions))


@register
class ExportedRuntime(Runtime):
    """``artifact``: an ExportedProgram, or the path of a ``.pt2`` (the fast recipe's custom ops are
    registered first)."""

    kind = "exported"

    def __init__(self, artifact, threads: int | None = None, settings=None):
        from harness.program import ExportSettings

        _set_threads(threads)
        t0 = time.perf_counter()
        program = artifact
        if not hasattr(artifact, "module"):
            from harness.export.pt2 import load_pt2
            from harness.oplib import load_custom_ops_for_export

            load_custom_ops_for_export()
            program = load_pt2(artifact)
        self.artifact, self.module = artifact, program.module()
        self.settings = settings or ExportSettings()
        self.max_context = self.settings.max_context
        self.load_s = time.perf_counter() - t0

    def step(self, ids, positions):
        import torch

        with torch.no_grad():
            return self.module(input_ids=as_long([ids] if isinstance(ids, list) else ids),
                               cache_position=as_long(positions))
