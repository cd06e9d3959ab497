"""What the fast program leaves outside XNNPACK, and why: ``{op: (most occurrences, reason)}`` for
a model config, as harness/export/lower.py's report names the operators. Anything else left to
ExecuTorch's portable or custom kernels, or more of it, is a regression of the fast path
(tests/test_fast_path.py)."""

from __future__ import annotations

from harness.export.fast.sharing import kv_sharing_modes

_MASK_REASON = ("the sliding-window mask and the ring-buffer indices, computed once per call from "
                "cache_position: int64 index arithmetic and comparisons, and XNNPACK computes floats only")
_SCALAR_REASON = ("start_pos = cache_position[0].item() and torch.export's runtime range checks on it: "
                  "scalar prim ops, no tensor work")
# the mask and ring-index arithmetic, once per call when the model has sliding layers
_MASK_OPS = {
    "aten.sub.Tensor": 4, "aten.remainder.Scalar": 2, "aten.ge.Scalar": 2, "aten.ge.Tensor": 1,
    "aten.lt.Scalar": 1, "aten.bitwise_and.Tensor": 2, "aten.where.self": 2, "aten.full.default": 1,
    "aten.full_like.default": 1, "aten.cat.default": 1, "aten.arange.start_step": 1,
    "aten.view_copy.default": 3, "aten.scalar_tensor.default": 4, "dim_order_ops._to_dim_order_copy.default": 2,
}


def portable_op_budget(config, tied: bool = True) -> dict[str, tuple[int, str]]:
    """``tied``: the token table and ``lm_head`` share one INT4 copy (harness/export/fast/tied.py, the
    8da4w-fast recipe); else the table is looked up by its own quantized embedding."""
    n = int(config.num_hidden_layers)
    types = list(config.layer_types)
    modes = kv_sharing_modes(config)
    producers = [i for i in range(n) if modes[i] != "reuse"]
    sliding_producers = [i for i in producers if types[i] == "sliding_attention"]
    has_sliding = "sliding_attention" in types
    ple = bool(config.hidden_size_per_layer_input)
    budget = {
        "llama.custom_sdpa.default": (
            n, "ExecuTorch's flash-attention kernel, one per layer: the op this path exists for "
               "(XNNPACK has no attention operator)"),
        "auto_functionalized_v2": (
            2 * len(producers), "the in-place KV-cache writes (llama::update_cache, "
            "update_cache_with_indices on ring layers), keys and values of each layer that owns a "
            "cache: a memcpy into a mutable buffer, which XNNPACK cannot write"),
        "aten.slice_copy.Tensor": (
            (2 * len(sliding_producers) + 1) if has_sliding else 0,
            "ring layers: the new keys/values taken back out of cat(ring, new) so that the ring write "
            "depends on the ring read (XNNPACK refuses slices of a dynamic-length tensor); and "
            "cache_position[-1:] for the ring indices"),
        "aten.select_copy.int": (
            1 + (n if ple else 0), "cache_position[0] for start_pos, and the per-layer input of each "
            "layer (s x hidden_size_per_layer_input floats): XNNPACK has no select"),
        "aten.index.Tensor": (
            2 * len(set(types)), "RoPE cos and sin rows gathered at cache_position, one table per "
            "layer type (a gather; XNNPACK has none)"),
        "aten.embedding.default": (
            3 * int(ple) + int(not tied), "the per-layer table gathered row first (its INT8 codes, "
            "zero points and scales, harness/export/fast/embedding.py: torchao's lookup dequantizes the "
            "whole table) and an untied token table's lookup (gathers; XNNPACK has none)"),
        "torchao.dequantize_affine.default": (
            int(not tied), "an untied quantized token table's dequantization, fused with its gather "
            "into embedding_byte / embedding_4bit at to_executorch (only the gathered rows)"),
        "quantized_decomposed.embedding_4bit.dtype": (
            int(tied), "the token lookup in the shared INT4 table: a gather of the rows (XNNPACK has "
            "no gather)"),
        "harness.q4_linear.default": (
            int(tied), "lm_head on the shared INT4 token table (the harness's own kernel): XNNPACK "
            "would pack a second copy of the table"),
        "aten._local_scalar_dense.default": (1, _SCALAR_REASON),
        "aten._assert_scalar.default": (4, _SCALAR_REASON),
        "aten.sym_size.int": (1, _SCALAR_REASON),
        "<built-in function le>": (2, _SCALAR_REASON),
        "<built-in function ge>": (2, _SCALAR_REASON),
        "<built-in function add>": (2, _SCALAR_REASON),
        "<built-in function sub>": (2, _SCALAR_REASON),
    }
    if has_sliding:
        budget.update({op: (count, _MASK_REASON) for op, count in _MASK_OPS.items()})
    if ple:  # the gathered INT8 codes to float32 (XNNPACK converts no integer tensors)
        count, why = budget.get("dim_order_ops._to_dim_order_copy.default", (0, ""))
        budget["dim_order_ops._to_dim_order_copy.default"] = (
            count + 1, (why + "; " if why else "") + "the per-layer table's gathered INT8 codes to float32")
    return {op: v for op, v in budget.items() if v[0] > 0}
