"""The fast recipe's token table: Gemma ties ``embed_tokens`` to ``lm_head``; here it is quantized
in place with torchao, INT8 per row or INT4 in ``lm_head``'s own groups."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.errors import HarnessError

EMBEDDING_SCHEMES = ("int8", "int4")


def quantize_embedding(model, scheme: str, group_size: int) -> dict:
    """Quantize the main token embedding (tied to ``lm_head`` in Gemma) in place with torchao.

    ``int8``: per-row INT8 (``embedding_byte`` at run time). ``int4``: symmetric INT4 per group of
    ``group_size`` along the hidden dim, the very scheme ``8da4w`` gives the tied ``lm_head``, so
    the gathered rows equal the dequantized ``lm_head`` rows, and the export wrapper stores the
    table once for both (harness/export/fast/tied.py: ``embedding_4bit`` for the lookup, the
    harness's own ``q4_linear`` for ``lm_head``)."""
    import torch
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    emb = model.model.embed_tokens
    if scheme == "int8":
        config = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))
    elif scheme == "int4":
        config = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group_size))
    else:
        raise HarnessError(f"unknown embedding scheme {scheme!r}", f"use one of {EMBEDDING_SCHEMES}")
    emb.padding_idx = None  # the quantized lookup asserts it (see harness/export/quantize.py)
    quantize_(model, config, filter_fn=lambda m, fqn: m is emb)
    return {"embedding": f"{scheme}" + (f" group {group_size}" if scheme == "int4" else " per-row")}




def gathered_table(module):
    """The per-layer token table (E2B: 262,144 x 8,960, INT8 per row) for the export wrapper:
    looked up row first when torchao quantized it INT8 per row (``GatheredTable``), else the module
    as it is."""
    weight = module.weight
    if getattr(weight, "tensor_data_names", None) == ["qdata", "scale", "zero_point"] and weight.qdata.dim() == 2 \
            and tuple(weight.block_size) == (1, weight.qdata.shape[1]):
        return GatheredTable(module)
    return module


class GatheredTable(torch.nn.Module):
    """The codes, zero points and scales of the ids asked for are gathered, then dequantized exactly
    as torchao dequantizes (subtract the zero point, exact for INT8 in float32; multiply by the scale), then multiplied by Gemma's embed
    scale: bit-exact with torchao's own lookup, which dequantizes the whole table first. That is
    9.4 GB of float32 at E2B size on every call of the eager model and of the exported ``.pt2`` (a
    16 GiB machine is killed); the ``.pte`` was spared only because its quant fusion turns the pair
    into ``embedding_byte``."""

    def __init__(self, module):
        super().__init__()
        w = module.weight
        rows = w.qdata.shape[0]
        self.register_buffer("codes", w.qdata)
        self.register_buffer("scale", w.scale.reshape(rows, 1))
        # the zero points as float32: int8 - int8 is exact in float32, so this subtracts as torchao does
        self.register_buffer("zero", None if w.zero_point is None else w.zero_point.reshape(rows, 1).to(w.dtype))
        self.register_buffer("embed_scale", getattr(module, "embed_scale", None), persistent=False)
        self.dtype = w.dtype

    def forward(self, ids):
        rows = F.embedding(ids, self.codes).to(self.dtype)
        if self.zero is not None:
            rows = rows - F.embedding(ids, self.zero)
        out = rows * F.embedding(ids, self.scale)
        if self.embed_scale is not None:
            out = out * self.embed_scale.to(self.dtype)
        return out
