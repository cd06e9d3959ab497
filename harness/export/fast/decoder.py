"""The fast recipe's export wrapper: Gemma 4's decoder around ExecuTorch's custom attention and
KV-cache ops, with the harness's signature ``forward(input_ids[1, s], cache_position[s]) ->
logits[1, s, V]`` (prefill in one call for any s in range, then one token per call).

- full-attention layers: a cache of ``max_context`` slots, causal attention from ``start_pos``
  (no mask: the kernel only reads the first ``start_pos + s`` slots);
- sliding layers: a ring buffer of ``sliding_window`` slots. A call attends to ``cat(ring, new
  keys)`` with a mask built from the slots' positions, *then* writes its last ``min(s, window)``
  keys into the ring (earlier keys of a longer prefill go to one trash slot that is always
  masked), so a prefill longer than the window is exact in one call: the new keys never overwrite
  keys that an earlier query of the same call still needs;
- KV-shared layers reuse the producer layer's keys and values (and mask), as transformers does;
- the glue is written so XNNPACK takes it: RMSNorm's mean as a 4-D ``mean.dim`` with ``rsqrt``,
  rotate_half as a constant ±1 permutation matmul, reshapes with one inferred ``-1`` dim.

Found on the way: ExecuTorch 1.5.1's portable ``remainder.Scalar`` truncates toward zero for a
negative int64 dividend (torch.remainder floors), so the ring's slot arithmetic keeps its
dividend non-negative; and ``custom_sdpa`` with a mask reads every slot of the key tensor (the
mask must be [s, slots]), while without a mask it reads only the first ``start_pos + s``.
"""

from __future__ import annotations

import torch

from harness.export.fast.embedding import gathered_table
from harness.export.fast.sharing import kv_sharing_modes
from harness.export.fast.tied import tied_table
from harness.errors import HarnessError
from harness.oplib import load_custom_ops_for_export


# ---- building blocks ----------------------------------------------------------------------------
def rms_norm(x, weight, eps: float):
    """Gemma 4's RMSNorm: ``x * (mean(x^2) + eps)^-0.5 * weight`` (weight used as is, not 1 + w).
    ``x`` is [1, s, *rest]; the mean is a 4-D mean over dims (2, 3) (the only mean XNNPACK's
    partitioner takes) with ``rsqrt`` (it takes ``pow`` only with exponent 2), and every reshape has
    one inferred dim (symbolic reshapes stay portable)."""
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


# ---- the wrapper ----------------------------------------------------------------------------------
class FastGemma4(torch.nn.Module):
    """Export wrapper: ``forward(input_ids[1, s], cache_position[s]) -> logits[1, s, V]``; owns
    the KV caches (ring buffers on sliding layers) and the RoPE tables as buffers."""

    def __init__(self, model, max_context: int):
        super().__init__()
        cfg = model.config
        inner = model.model
        if getattr(cfg, "enable_moe_block", False):
            raise HarnessError("the fast path does not support Gemma 4 MoE blocks", "use the 8da4w recipe")
        if getattr(cfg, "attention_k_eq_v", False):
            raise HarnessError("the fast path does not support attention_k_eq_v", "use the 8da4w recipe")
        self.max_context = int(max_context)
        self.window = int(cfg.sliding_window)
        self.eps = float(cfg.rms_norm_eps)
        self.softcap = cfg.final_logit_softcapping
        self.layer_types = list(cfg.layer_types)
        self.n_layers = int(cfg.num_hidden_layers)
        self.n_heads = int(cfg.num_attention_heads)
        modes = kv_sharing_modes(cfg)
        # the producer of each layer type's shared keys/values: the layer marked "store"
        self.store_of = {}
        for i, mode in enumerate(modes):
            if mode == "store":
                self.store_of[self.layer_types[i]] = i
        self.reuses = [mode == "reuse" for mode in modes]
        for i, t in enumerate(self.layer_types):
            if self.reuses[i] and t not in self.store_of:
                raise HarnessError(f"layer {i} reuses {t} keys but no layer stores them", "check the config")

        # the token table and lm_head: one INT4 copy for both when they are tied and quantized
        # alike (harness/export/fast/tied.py), else each as the model holds it
        self.tied = tied_table(model)
        if self.tied is None:
            self.embed_tokens = inner.embed_tokens
            self.lm_head = model.lm_head
        self.layers = inner.layers
        self.norm = inner.norm
        self.ple_dim = int(cfg.hidden_size_per_layer_input or 0)
        if self.ple_dim:
            # row first: torchao's lookup dequantizes the whole INT8 table on every call
            self.embed_tokens_per_layer = gathered_table(inner.embed_tokens_per_layer)
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
            # rotate_half as a constant ±1 permutation matmul (slices of a tensor with a dynamic
            # dim stay portable). Persistent: lowering deletes the lifted constants XNNPACK
            # consumes from the ExportedProgram it is given (a non-persistent buffer is such a
            # constant), and the pipeline still runs that program afterwards
            self.register_buffer(f"rot_{t}", rotate_half_matrix(d))

        # caches: [1, slots, kv_heads, head_dim] (the custom ops' layout), one per producing layer
        self.ring_size = self.window
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            if self.reuses[i]:
                continue
            d = attn.head_dim
            kv_heads = int(cfg.per_layer_config[i].num_key_value_heads)
            if self.layer_types[i] == "sliding_attention":
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
                        self.eps)

    def _rope(self, x, cos, sin, layer_type):
        import torch.nn.functional as F

        return x * cos + F.linear(x, getattr(self, f"rot_{layer_type}")) * sin

    def _sliding_mask(self, cache_position, start, n):
        """[n, keys] float mask (0 or -inf) for sliding layers; keys = the ring's slots, its trash
        slot, then the n new keys."""
        q = cache_position.reshape(-1, 1)
        r = self.ring_size
        j = torch.arange(r, dtype=torch.long)
        # the position slot j holds before this call: the last p < start with p % r == j
        # (negative: never written in this generation); the trash slot r is never valid
        # (+ r keeps the dividend >= 0: ExecuTorch's portable remainder truncates toward zero
        # on negative int64 dividends, where torch.remainder floors)
        slot = (start - 1) - torch.remainder((start - 1 + r) - j, r)
        kpos = torch.cat((slot, torch.full((1,), -1, dtype=torch.long), cache_position))
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
            if t == "sliding_attention":
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

        h = self.embed_tokens(input_ids) if self.tied is None else self.tied(input_ids)
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
        if "sliding_attention" in tables:
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
        if self.tied is not None:
            return self.tied.head(h, self.softcap)
        logits = self.lm_head(h)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def make_fast_wrapper(model, max_context: int):
    load_custom_ops_for_export()  # llama::custom_sdpa / update_cache and their meta kernels
    model.requires_grad_(False)
    return FastGemma4(model, max_context).eval()
