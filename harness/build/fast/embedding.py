"""The fast recipe's token table: Gemma ties ``embed_tokens`` to ``lm_head``; here it is quantized
in place with torchao, INT8 per row or INT4 in ``lm_head``'s own groups."""

from __future__ import annotations

from harness.errors import HarnessError

EMBEDDING_SCHEMES = ("int8", "int4")


def quantize_embedding(model, scheme: str, group_size: int) -> dict:
    """Quantize the main token embedding (tied to ``lm_head`` in Gemma) in place with torchao.

    ``int8``: per-row INT8 (``embedding_byte`` at run time). ``int4``: symmetric INT4 per group of
    ``group_size`` along the hidden dim, the very scheme ``8da4w`` gives the tied ``lm_head``, so
    the gathered rows equal the dequantized ``lm_head`` rows, and the export wrapper stores the
    table once for both (harness/build/fast/tied.py: ``embedding_4bit`` for the lookup, the
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
    emb.padding_idx = None  # the quantized lookup asserts it (see harness/build/quantize.py)
    quantize_(model, config, filter_fn=lambda m, fqn: m is emb)
    return {"embedding": f"{scheme}" + (f" group {group_size}" if scheme == "int4" else " per-row")}
