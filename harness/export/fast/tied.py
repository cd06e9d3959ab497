"""The tied token table stored once. Gemma ties ``embed_tokens`` to ``lm_head``; under 8da4w-fast
both are INT4 in the same groups, so both read one copy: the lookup through ExecuTorch's
``quantized_decomposed::embedding_4bit`` and ``lm_head`` through ``harness::q4_linear``, an
operator of our own (its run-time kernel: harness/runtimes/cpp/tied_kernels.cpp). Before, XNNPACK
packed a second copy of the table for ``lm_head`` (201 MB of the E2B-size ``.pte``).

``q4_linear``'s eager definition is torchao's 8da4w arithmetic on that data (INT8 asymmetric
per-token activations, quantized and dequantized, against the dequantized INT4 weights, an FP32
matmul), so the wrapper says bit for bit what the quantized model's ``lm_head`` says."""

from __future__ import annotations

import torch

from harness.errors import HarnessError
from harness.oplib import define_harness_ops, unpack

QMIN, QMAX = -8, 7


def pack(qdata: torch.Tensor) -> torch.Tensor:
    """int8 [V, D] in [-8, 7] -> uint8 [V, D/2] in ``embedding_4bit``'s layout: weight 2j in the
    high nibble of byte j, weight 2j+1 in the low one, each stored as w + 8."""
    u = (qdata.to(torch.int16) + 8).to(torch.uint8)
    return (u[:, 0::2] << 4) | u[:, 1::2]


def row_sums(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[V] FP32: sum over groups of scale x (sum of the row's weights in the group); the kernel's
    correction for the activations' zero point (tied_kernels.cpp). Group sums are exact integers."""
    q = unpack(packed)
    v = q.shape[0]
    sums = q.reshape(v, scales.shape[1], -1).sum(-1, dtype=torch.int32)
    return (sums.to(torch.float64) * scales.to(torch.float64)).sum(-1).to(torch.float32)


define_harness_ops()


class TiedTable(torch.nn.Module):
    """One INT4 copy of the token table, for the lookup and for ``lm_head``."""

    def __init__(self, qdata: torch.Tensor, scales: torch.Tensor, embed_scale: float):
        super().__init__()
        import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401  (embedding_4bit)

        packed = pack(qdata)
        scales = scales.to(torch.float32).contiguous()
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("row_sums", row_sums(packed, scales))
        self.embed_scale = float(embed_scale)

    def forward(self, ids):
        """The token lookup (a module call, so a forward hook sees the embeddings as it sees
        ``embed_tokens``' in the untied model: harness.bench.scale.nudge_sensitivity)."""
        rows = torch.ops.quantized_decomposed.embedding_4bit.dtype(
            self.packed, self.scales, None, QMIN, QMAX, ids, dtype=torch.float32)
        return rows * self.embed_scale

    def head(self, h, softcap: float | None = None):
        """``lm_head``, then Gemma's logit softcapping in the same operator (a separate XNNPACK
        delegate would plan and clear workspace for [s, V] intermediates at every prefill)."""
        return torch.ops.harness.q4_linear(h, self.packed, self.scales, self.row_sums, float(softcap or 0.0))


def _int4_parts(weight):
    """(qdata, scales) of a torchao INT4 per-group weight with zero points 0, else None."""
    qdata, scale, zero = (getattr(weight, a, None) for a in ("qdata", "scale", "zero_point"))
    if qdata is None or scale is None or getattr(weight, "target_dtype", None) != torch.int4:
        return None
    if zero is not None and bool(torch.any(zero != 0)):
        return None
    if scale.dim() != 2 or qdata.shape[1] % scale.shape[1]:
        return None
    return qdata, scale


def tied_table(model) -> TiedTable | None:
    """The shared table when ``embed_tokens`` and ``lm_head`` are tied and hold the same INT4 data
    (8da4w-fast's ``embedding="int4"``), else None (the wrapper keeps both)."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return None
    emb = model.model.embed_tokens
    table, head = _int4_parts(emb.weight), _int4_parts(model.lm_head.weight)
    if table is None or head is None:
        return None
    if getattr(model.lm_head, "bias", None) is not None:
        return None
    if not (torch.equal(table[0], head[0]) and torch.equal(table[1], head[1])):
        raise HarnessError("the tied token table and lm_head were quantized to different INT4 data",
                           "quantize both with the same group size (harness/export/quantize.py)")
    embed_scale = getattr(emb, "embed_scale", 1.0)
    embed_scale = float(embed_scale.to(torch.float32)) if torch.is_tensor(embed_scale) else float(embed_scale)
    return TiedTable(head[0], head[1], embed_scale)
