"""The fast export path (recipe ``8da4w-fast``): Gemma 4's decoder rewritten around ExecuTorch's
LLM custom ops so that almost everything is delegated to XNNPACK.

The program keeps the harness's signature, ``forward(input_ids[1, s], cache_position[s]) ->
logits[1, s, V]`` (prefill in one call for any s in range, then one token per call), and reuses
the transformers model's own submodules and weights, so torchao's quantization applies exactly
as for ``8da4w``. What changes is the decoder's forward:

- attention is ``torch.ops.llama.custom_sdpa`` (a tiled flash-attention kernel that reads the
  cache in place, GQA without repeat_kv) and the KV cache is written with
  ``torch.ops.llama.update_cache`` / ``update_cache_with_indices``; both live in
  ``libcustom_ops_aot_lib.so`` of the executorch wheel, which registers the export-time ops
  *and* their runtime out-variants (``llama::custom_sdpa.out``...) in the Python runtime;
- full-attention layers: a cache of ``max_context`` slots, causal attention from ``start_pos``
  (no mask: the kernel only reads the first ``start_pos + s`` slots);
- sliding layers (``ring=True``): a ring buffer of ``sliding_window`` slots. A call attends to
  ``cat(ring, new keys)`` with a mask built from the slots' positions, *then* writes its last
  ``min(s, window)`` keys into the ring (earlier keys of a longer prefill go to one trash slot
  that is always masked), so a prefill longer than the window is exact in one call: the new keys
  never overwrite keys that an earlier query of the same call still needs;
- KV-shared layers reuse the producer layer's keys and values (and mask), as transformers does;
- ``xnn=True`` writes the glue so XNNPACK can take it: RMSNorm's mean as a 4-D ``mean.dim``
  over the two innermost dims (the only mean XNNPACK's partitioner takes) with ``rsqrt`` (it
  takes ``pow`` only with exponent 2); rotate_half as a constant ±1 permutation matmul (slices
  of a tensor with a dynamic dim stay portable); reshapes with one inferred ``-1`` dim
  (symbolic reshapes stay portable);
- the token table (tied to ``lm_head``) can be INT8 per row or INT4 in lm_head's own groups
  (``quantize_embedding``, recipe field ``embedding``).

What is left outside XNNPACK, with a reason for each op, is ``portable_op_budget``. Numerics
differ from transformers' eager attention only by summation order (flash attention, rsqrt vs
pow(-0.5), mean over 4-D): greedy ids equal the ``8da4w`` goldens (tests/test_fast_path.py).

Found on the way: ExecuTorch 1.5.1's portable ``remainder.Scalar`` truncates toward zero for a
negative int64 dividend (torch.remainder floors), so the ring's slot arithmetic keeps its
dividend non-negative; and ``custom_sdpa`` with a mask reads every slot of the key tensor (the
mask must be [s, slots]), while without a mask it reads only the first ``start_pos + s``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from harness.errors import HarnessError

CUSTOM_OPS_LIB = "libcustom_ops_aot_lib"


@dataclass(frozen=True)
class FastOptions:
    ring: bool = True  # sliding layers: ring buffer of window size (else a max_context cache + mask)
    xnn: bool = True  # norm / rope / per-layer-input glue written so that XNNPACK takes it

    def as_dict(self) -> dict:
        return asdict(self)


# ---- the op library -----------------------------------------------------------------------------
_LOADED = False


def load_custom_ops() -> None:
    """Register ``llama::custom_sdpa`` / ``update_cache`` (export) and their ``.out`` kernels
    (ExecuTorch runtime). Loading the shared library is enough for the runtime; the Python module
    ``executorch.extension.llm.custom_ops.custom_ops`` adds the meta kernels export needs (and
    imports torch._inductor, ~6 s), so export calls ``load_custom_ops_for_export()``."""
    global _LOADED
    if _LOADED:
        return
    import importlib.util
    from pathlib import Path
    from executorch.extension.pybindings import portable_lib  # noqa: F401  (the runtime registry)

    try:
        torch.ops.llama.custom_sdpa.default  # already registered (e.g. by custom_ops.py)
    except (AttributeError, RuntimeError):
        spec = importlib.util.find_spec("executorch.extension.llm.custom_ops")
        if spec is None or not spec.submodule_search_locations:
            raise HarnessError("executorch.extension.llm.custom_ops is not installed",
                               "install the executorch wheel the harness pins (1.5.1)") from None
        libs = sorted(Path(next(iter(spec.submodule_search_locations))).glob(f"**/{CUSTOM_OPS_LIB}.*"))
        if not libs:
            raise HarnessError(f"{CUSTOM_OPS_LIB} not found in the executorch wheel",
                               "reinstall executorch 1.5.1") from None
        torch.ops.load_library(str(libs[0]))
    _LOADED = True


def load_custom_ops_for_export() -> None:
    load_custom_ops()
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (meta kernels)


# ---- building blocks ----------------------------------------------------------------------------
def rms_norm(x, weight, eps: float, xnn: bool):
    """Gemma 4's RMSNorm: ``x * (mean(x^2) + eps)^-0.5 * weight`` (weight used as is, not 1 + w).
    ``x`` is [1, s, *rest]; with ``xnn`` the mean is a 4-D mean over dims (2, 3) and every reshape
    has one inferred dim, which is what XNNPACK's partitioner accepts."""
    if not xnn:
        ms = x.pow(2).mean(-1, keepdim=True) + eps
        out = x * torch.pow(ms, -0.5)
        return out * weight if weight is not None else out
    d = x.shape[-1]
    rest = tuple(x.shape[2:])
    x4 = x.reshape(1, -1, d, 1)
    ms = (x4 * x4).mean(dim=(2, 3), keepdim=True) + eps
    out = x4 * torch.rsqrt(ms)
    if weight is not None:
        out = out * weight.reshape(d, 1)
    return out.reshape(1, -1, *rest)


def rotate_half_matrix(d: int):
    """W with ``x @ W.T == rotate_half(x)`` = cat(-x[d/2:], x[:d/2]); entries 0 and ±1, so the
    matmul is exact."""
    h = d // 2
    w = torch.zeros(d, d)
    idx = torch.arange(h)
    w[idx, idx + h] = -1.0
    w[idx + h, idx] = 1.0
    return w


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


# ---- the wrapper ----------------------------------------------------------------------------------
class FastGemma4(torch.nn.Module):
    """Export wrapper: ``forward(input_ids[1, s], cache_position[s]) -> logits[1, s, V]``; owns
    the KV caches (ring buffers on sliding layers) and the RoPE tables as buffers."""

    def __init__(self, model, max_context: int, options: FastOptions = FastOptions()):
        super().__init__()
        cfg = model.config
        inner = model.model
        if getattr(cfg, "enable_moe_block", False):
            raise HarnessError("the fast path does not support Gemma 4 MoE blocks", "use the 8da4w recipe")
        if getattr(cfg, "attention_k_eq_v", False):
            raise HarnessError("the fast path does not support attention_k_eq_v", "use the 8da4w recipe")
        self.options = options
        self.max_context = int(max_context)
        self.window = int(cfg.sliding_window)
        self.eps = float(cfg.rms_norm_eps)
        self.softcap = cfg.final_logit_softcapping
        self.layer_types = list(cfg.layer_types)
        self.n_layers = int(cfg.num_hidden_layers)
        self.n_heads = int(cfg.num_attention_heads)
        modes = list(cfg.kv_sharing_modes)
        # the producer of each layer type's shared keys/values: the layer marked "store"
        self.store_of = {}
        for i, mode in enumerate(modes):
            if mode == "store":
                self.store_of[self.layer_types[i]] = i
        self.reuses = [mode == "reuse" for mode in modes]
        for i, t in enumerate(self.layer_types):
            if self.reuses[i] and t not in self.store_of:
                raise HarnessError(f"layer {i} reuses {t} keys but no layer stores them", "check the config")

        self.embed_tokens = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.lm_head = model.lm_head
        self.ple_dim = int(cfg.hidden_size_per_layer_input or 0)
        if self.ple_dim:
            self.embed_tokens_per_layer = inner.embed_tokens_per_layer
            self.per_layer_model_projection = inner.per_layer_model_projection
            self.per_layer_projection_norm = inner.per_layer_projection_norm
            self.per_layer_model_projection_scale = float(inner.per_layer_model_projection_scale)
            self.per_layer_input_scale = float(inner.per_layer_input_scale)

        # RoPE: cos/sin tables per layer type, computed as transformers computes them
        rope = inner.rotary_emb
        pos = torch.arange(self.max_context, dtype=torch.float32)
        self.head_dim = {}
        for t in sorted(set(self.layer_types)):
            inv = getattr(rope, f"{t}_inv_freq").float()
            scale = getattr(rope, f"{t}_attention_scaling")
            freqs = pos[:, None] * inv[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer(f"cos_{t}", emb.cos() * scale, persistent=False)
            self.register_buffer(f"sin_{t}", emb.sin() * scale, persistent=False)
            d = emb.shape[-1]
            self.head_dim[t] = d
            if options.xnn:
                # persistent: lowering deletes the lifted constants XNNPACK consumes from the
                # ExportedProgram it is given (a non-persistent buffer is such a constant), and the
                # pipeline still runs that program afterwards
                self.register_buffer(f"rot_{t}", rotate_half_matrix(d))

        # caches: [1, slots, kv_heads, head_dim] (the custom ops' layout), one per producing layer
        self.ring_size = self.window if options.ring else None
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            if self.reuses[i]:
                continue
            d = attn.head_dim
            kv_heads = int(cfg.per_layer_config[i].num_key_value_heads)
            if self.layer_types[i] == "sliding_attention" and options.ring:
                slots = self.window + 1  # the ring plus one trash slot
            else:
                slots = self.max_context
            self.register_buffer(f"k_cache_{i}", torch.zeros(1, slots, kv_heads, d), persistent=False)
            self.register_buffer(f"v_cache_{i}", torch.zeros(1, slots, kv_heads, d), persistent=False)
            if d != self.head_dim[self.layer_types[i]]:
                raise HarnessError(f"layer {i}: head_dim {d} differs from its RoPE table "
                                   f"({self.head_dim[self.layer_types[i]]})", "report this config")

    # ---- pieces ---------------------------------------------------------------------------------
    def _norm(self, x, module):
        return rms_norm(x, getattr(module, "weight", None) if getattr(module, "with_scale", True) else None,
                        self.eps, self.options.xnn)

    def _rope(self, x, cos, sin, layer_type):
        import torch.nn.functional as F

        if self.options.xnn:
            rotated = F.linear(x, getattr(self, f"rot_{layer_type}"))
        else:
            rotated = _rotate_half(x)
        return x * cos + rotated * sin

    def _sliding_mask(self, cache_position, start, n):
        """[n, keys] float mask (0 or -inf) for sliding layers; keys = ring slots then the n new
        keys (ring) or the max_context cache slots (no ring)."""
        q = cache_position.reshape(-1, 1)
        if self.options.ring:
            r = self.ring_size
            j = torch.arange(r, dtype=torch.long)
            # the position slot j holds before this call: the last p < start with p % r == j
            # (negative: never written in this generation); the trash slot r is never valid
            # (+ r keeps the dividend >= 0: ExecuTorch's portable remainder truncates toward zero
            # on negative int64 dividends, where torch.remainder floors)
            slot = (start - 1) - torch.remainder((start - 1 + r) - j, r)
            kpos = torch.cat((slot, torch.full((1,), -1, dtype=torch.long), cache_position))
        else:
            kpos = torch.arange(self.max_context, dtype=torch.long)
        k = kpos.reshape(1, -1)
        d = q - k
        ok = (k >= 0) & (d >= 0) & (d < self.window)
        return torch.where(ok, 0.0, float("-inf")).to(torch.float32)

    def _attention(self, i, x, cos, sin, start, shared, mask, ring_idx):
        layer = self.layers[i].self_attn
        t = self.layer_types[i]
        d = layer.head_dim
        q = layer.q_proj(x).reshape(1, -1, self.n_heads, d)
        q = self._norm(q, layer.q_norm)
        q = self._rope(q, cos, sin, t)
        if self.reuses[i]:
            k_all, v_all = shared[t]
        else:
            kv_heads = getattr(self, f"k_cache_{i}").shape[2]
            k = layer.k_proj(x).reshape(1, -1, kv_heads, d)
            v = layer.v_proj(x).reshape(1, -1, kv_heads, d)
            k = self._rope(self._norm(k, layer.k_norm), cos, sin, t)
            v = self._norm(v, layer.v_norm)
            k_cache, v_cache = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
            if t == "sliding_attention" and self.options.ring:
                slots = self.ring_size + 1
                k_all = torch.cat((k_cache, k), dim=1)
                v_all = torch.cat((v_cache, v), dim=1)
                # the new keys are written sliced from the concatenation, so the write depends on
                # the read of the ring and no scheduler can move it first
                torch.ops.llama.update_cache_with_indices(k_all[:, slots:], k_cache, 0, ring_idx)
                torch.ops.llama.update_cache_with_indices(v_all[:, slots:], v_cache, 0, ring_idx)
            else:
                torch.ops.llama.update_cache(k, k_cache, start)
                torch.ops.llama.update_cache(v, v_cache, start)
                k_all, v_all = k_cache, v_cache
            shared[t] = (k_all, v_all)
        if t == "sliding_attention":
            out = torch.ops.llama.custom_sdpa(q, k_all, v_all, 0, mask, 0.0, False, layer.scaling)
        else:
            out = torch.ops.llama.custom_sdpa(q, k_all, v_all, start, None, 0.0, True, layer.scaling)
        return layer.o_proj(out.reshape(1, -1, self.n_heads * d))

    def forward(self, input_ids, cache_position):
        s = input_ids.shape[1]
        start = cache_position[0].item()
        torch._check(start >= 0)
        torch._check(start + s <= self.max_context)
        torch._check(start < self.max_context)

        h = self.embed_tokens(input_ids)
        pli = None
        if self.ple_dim:
            L, P = self.n_layers, self.ple_dim
            token = self.embed_tokens_per_layer(input_ids).reshape(1, -1, L, P)
            proj = self.per_layer_model_projection(h) * self.per_layer_model_projection_scale
            proj = self._norm(proj.reshape(1, -1, L, P), self.per_layer_projection_norm)
            pli = (proj + token) * self.per_layer_input_scale
            # one select per layer (a portable copy of s * P floats: XNNPACK has no select, and
            # unbind lowers to a slice and a squeeze per layer)
            pli = [pli[:, :, i, :] for i in range(L)]

        tables = {}
        for t in set(self.layer_types):
            d = self.head_dim[t]
            cos = getattr(self, f"cos_{t}")[cache_position].reshape(1, -1, 1, d)
            sin = getattr(self, f"sin_{t}")[cache_position].reshape(1, -1, 1, d)
            tables[t] = (cos, sin)
        mask = self._sliding_mask(cache_position, start, s) if "sliding_attention" in tables else None
        ring_idx = None
        if self.options.ring and "sliding_attention" in tables:
            # the last min(s, r) new tokens go to slot p % r, earlier ones of a long prefill to the
            # trash slot r: no duplicate targets among live slots, no guard on s vs r
            r = self.ring_size
            last = cache_position[-1:] - (r - 1)
            ring_idx = torch.where(cache_position >= last, torch.remainder(cache_position, r),
                                   torch.full_like(cache_position, r)).reshape(1, -1)

        shared: dict = {}
        for i, layer in enumerate(self.layers):
            t = self.layer_types[i]
            cos, sin = tables[t]
            residual = h
            x = self._norm(h, layer.input_layernorm)
            x = self._attention(i, x, cos, sin, start, shared, mask, ring_idx)
            x = self._norm(x, layer.post_attention_layernorm)
            h = residual + x
            residual = h
            x = self._norm(h, layer.pre_feedforward_layernorm)
            x = layer.mlp(x)
            x = self._norm(x, layer.post_feedforward_layernorm)
            h = residual + x
            if pli is not None:
                residual = h
                x = layer.act_fn(layer.per_layer_input_gate(h))
                x = layer.per_layer_projection(x * pli[i])
                x = self._norm(x, layer.post_per_layer_input_norm)
                h = residual + x
            h = h * layer.layer_scalar
        h = self._norm(h, self.norm)
        logits = self.lm_head(h)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def make_fast_wrapper(model, max_context: int, options: FastOptions = FastOptions()):
    load_custom_ops_for_export()
    model.requires_grad_(False)
    return FastGemma4(model, max_context, options).eval()


def export_fast(model, settings, options: FastOptions = FastOptions()):
    """``torch.export`` of the fast wrapper with explicit options (the ablations: ring, xnn), like
    harness.export.export_program; the pipeline itself goes through export_program, which picks
    this wrapper with default options for a model a fast recipe quantized."""
    from torch.export import Dim

    from harness.export import example_inputs

    wrapper = make_fast_wrapper(model, settings.max_context, options)
    seq = Dim("seq", min=1, max=settings.max_seq)
    with torch.no_grad():
        return torch.export.export(
            wrapper, args=(), kwargs=example_inputs(),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=True,
        )


# ---- the main embedding table -----------------------------------------------------------------
EMBEDDING_SCHEMES = ("int8", "int4")


def quantize_embedding(model, scheme: str, group_size: int) -> dict:
    """Quantize the main token embedding (tied to ``lm_head`` in Gemma) in place with torchao.

    ``int8``: per-row INT8 (``embedding_byte`` at run time). ``int4``: symmetric INT4 per group of
    ``group_size`` along the hidden dim, the very scheme ``8da4w`` gives the tied ``lm_head``, so
    the gathered rows equal the dequantized ``lm_head`` rows (``embedding_4bit`` at run time).
    XNNPACK still packs its own copy of the ``lm_head`` weights: the table is stored twice, but
    at 4 bits instead of FP32 (torchao's shared-embedding kernels that would read one copy are
    not in the executorch wheel's runtime)."""
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    emb = model.model.embed_tokens
    if scheme == "int8":
        config = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))
    elif scheme == "int4":
        config = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group_size))
    else:
        raise HarnessError(f"unknown embedding scheme {scheme!r}", f"use one of {EMBEDDING_SCHEMES}")
    emb.padding_idx = None  # the quantized lookup asserts it (see harness/quantize.py)
    quantize_(model, config, filter_fn=lambda m, fqn: m is emb)
    return {"embedding": f"{scheme}" + (f" group {group_size}" if scheme == "int4" else " per-row")}


# ---- what stays outside XNNPACK, and why --------------------------------------------------------
_MASK_REASON = ("the sliding-window mask and the ring-buffer indices, computed once per call from "
                "cache_position: int64 index arithmetic and comparisons, and XNNPACK computes floats only")
_SCALAR_REASON = ("start_pos = cache_position[0].item() and torch.export's runtime range checks on it: "
                  "scalar prim ops, no tensor work")


def portable_op_budget(config, options: FastOptions = FastOptions()) -> dict[str, tuple[int, str]]:
    """``{op: (most occurrences expected, reason)}`` for the operators the fast program leaves to
    ExecuTorch's portable/custom kernels (as harness.lower.op_report names them), for ``config``.
    Anything else left portable, or more of it, is a regression of the fast path."""
    n = int(config.num_hidden_layers)
    types = list(config.layer_types)
    modes = list(config.kv_sharing_modes)
    producers = [i for i in range(n) if modes[i] != "reuse"]
    sliding_producers = [i for i in producers if types[i] == "sliding_attention"]
    has_sliding = "sliding_attention" in types
    ring = options.ring and has_sliding
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
            (2 * len(sliding_producers) + 1) if ring else 0,
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
            2 if ple else 1, "the token and per-layer embedding lookups (gathers); quantized tables "
            "become quantized_decomposed::embedding_byte / embedding_4bit at to_executorch"),
        "torchao.dequantize_affine.default": (
            2 if ple else 1, "the quantized embedding tables' dequantization, fused with the gather "
            "into embedding_byte / embedding_4bit at to_executorch (only the gathered rows)"),
        "aten._local_scalar_dense.default": (1, _SCALAR_REASON),
        "aten._assert_scalar.default": (4, _SCALAR_REASON),
        "aten.sym_size.int": (1, _SCALAR_REASON),
        "<built-in function le>": (2, _SCALAR_REASON),
        "<built-in function ge>": (2, _SCALAR_REASON),
        "<built-in function add>": (2, _SCALAR_REASON),
        "<built-in function sub>": (2, _SCALAR_REASON),
    }
    if has_sliding:
        mask_ops = {  # (count with the ring, without)
            "aten.sub.Tensor": (4, 1), "aten.remainder.Scalar": (2, 0), "aten.ge.Scalar": (2, 2),
            "aten.ge.Tensor": (1, 0), "aten.lt.Scalar": (1, 1), "aten.bitwise_and.Tensor": (2, 2),
            "aten.where.self": (2, 1), "aten.full.default": (1, 0), "aten.full_like.default": (1, 0),
            "aten.cat.default": (1, 0), "aten.arange.start_step": (1, 1), "aten.view_copy.default": (3, 2),
            "aten.scalar_tensor.default": (4, 2), "dim_order_ops._to_dim_order_copy.default": (2, 0),
        }
        for op, (with_ring, without) in mask_ops.items():
            budget[op] = (with_ring if ring else without, _MASK_REASON)
    return {op: v for op, v in budget.items() if v[0] > 0}
