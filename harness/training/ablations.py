"""Removing one Gemma 4 E2B feature from a model, for the ablation tests (does the fixture lean on
it?) and for the fixture's training (make it lean on it). Each removal is the most direct one
that keeps transformers' Gemma 4 runnable:

- per-layer inputs: ``per_layer_inputs = 0`` in every layer; the whole per-layer branch goes
  (``residual + norm(proj(act(gate(h)) * 0))`` is ``residual``, since RMSNorm(0) = 0);
- KV sharing: the KV-shared layers compute their own K/V from their own input, with their
  producer layer's ``k_proj``/``v_proj``/``k_norm``/``v_norm`` (they have none of their own);
- the double-wide MLP: the KV-shared layers' MLP cut to the normal width (the first
  ``intermediate_size`` units);
- the sliding window: sliding layers attend to the whole context;
- the larger head size on full layers: full-attention layers keep only the first ``head_dim``
  dims (of ``global_head_dim``) per head of q/k/v after their norms and RoPE, and the matching
  ``o_proj`` inputs;
- softcapping: ``final_logit_softcapping = None``.

``removed(model, feature)`` changes the model in place, sharing its parameters (training
backpropagates through it), and undoes the change on exit; ``without(model, feature)`` is a deep
copy with the feature removed.
"""

from __future__ import annotations

import contextlib
import copy
import types

FEATURES = ("per-layer inputs", "KV sharing", "the double-wide MLP", "the sliding window",
            "the larger head size on full layers", "softcapping")


def _override(obj, name: str, value, undo: list) -> None:
    had = name in obj.__dict__
    old = obj.__dict__.get(name)
    setattr(obj, name, value)
    undo.append(lambda: setattr(obj, name, old) if had else delattr(obj, name))


def _per_layer_inputs(model, undo):
    import torch

    inner = model.model
    project = inner.project_per_layer_inputs

    def zero(self, inputs_embeds, per_layer_inputs=None):
        return torch.zeros_like(project(inputs_embeds, per_layer_inputs))

    _override(inner, "project_per_layer_inputs", types.MethodType(zero, inner), undo)


def _kv_sharing(model, undo):
    cfg, layers = model.config, model.model.layers
    first_shared = cfg.num_hidden_layers - cfg.num_kv_shared_layers
    for i in range(first_shared, cfg.num_hidden_layers):
        producer = max(j for j in range(first_shared) if cfg.layer_types[j] == cfg.layer_types[i])
        attn, src = layers[i].self_attn, layers[producer].self_attn
        if not attn.is_kv_shared_layer or "k_proj" in attn._modules:
            raise ValueError(f"layer {i} is not a KV consumer")
        for name in ("k_proj", "v_proj", "k_norm", "v_norm"):
            attn._modules[name] = getattr(src, name)
            undo.append(lambda a=attn, n=name: a._modules.pop(n))
        for flag, value in (("is_kv_shared_layer", False), ("store_full_length_kv", False)):
            old = getattr(attn, flag)
            setattr(attn, flag, value)
            undo.append(lambda a=attn, f=flag, o=old: setattr(a, f, o))
    old_n, old_first = cfg.num_kv_shared_layers, model.model.first_kv_shared_layer_idx
    cfg.num_kv_shared_layers = 0  # the cache then gives every layer a KV slot of its own
    model.model.first_kv_shared_layer_idx = cfg.num_hidden_layers
    undo.append(lambda: (setattr(cfg, "num_kv_shared_layers", old_n),
                         setattr(model.model, "first_kv_shared_layer_idx", old_first)))


def _double_wide_mlp(model, undo):
    from torch import nn

    n = model.config.intermediate_size
    cut = 0
    for layer in model.model.layers:
        mlp = layer.mlp
        if mlp.intermediate_size != 2 * n:
            continue

        def forward(self, x):
            g = nn.functional.linear(x, self.gate_proj.weight[:n])
            u = nn.functional.linear(x, self.up_proj.weight[:n])
            return nn.functional.linear(self.act_fn(g) * u, self.down_proj.weight[:, :n])

        _override(mlp, "forward", types.MethodType(forward, mlp), undo)
        cut += 1
    if cut != model.config.num_kv_shared_layers:
        raise ValueError(f"{cut} double-wide MLPs found")


def _sliding_window(model, undo):
    window = model.config.max_position_embeddings
    old = model.config.sliding_window
    model.config.sliding_window = window  # masks and the sliding cache layers read it from here
    undo.append(lambda: setattr(model.config, "sliding_window", old))
    for layer in model.model.layers:
        if layer.self_attn.is_sliding:
            attn, prev = layer.self_attn, layer.self_attn.sliding_window
            attn.sliding_window = window
            undo.append(lambda a=attn, p=prev: setattr(a, "sliding_window", p))


def _small_head_forward(small: int):
    import torch
    from torch import nn
    from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb, eager_attention_forward

    keep = torch.arange(small)

    def forward(self, hidden_states, position_embeddings, attention_mask, shared_kv_states, cache=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        cos, sin = position_embeddings
        q = self.q_norm(self.q_proj(hidden_states).view(shape))
        q = apply_rotary_pos_emb(q, cos, sin, unsqueeze_dim=2).transpose(1, 2)[..., keep]
        if self.is_kv_shared_layer:
            k, v = shared_kv_states[self.layer_type]
        else:
            k = self.k_norm(self.k_proj(hidden_states).view(shape))
            k = apply_rotary_pos_emb(k, cos, sin, unsqueeze_dim=2).transpose(1, 2)[..., keep]
            v = self.v_norm(self.v_proj(hidden_states).view(shape)).transpose(1, 2)[..., keep]
            if cache is not None:
                k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        if self.store_full_length_kv:
            shared_kv_states[self.layer_type] = k, v
        out, _ = eager_attention_forward(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling)
        out = out.reshape(*hidden_states.shape[:-1], -1)
        heads = out.shape[-1] // small
        cols = torch.cat([keep + h * self.head_dim for h in range(heads)])
        return nn.functional.linear(out, self.o_proj.weight[:, cols]), None

    return forward


def _larger_full_head(model, undo):
    kinds = model.config.layer_types
    small = max(l.self_attn.head_dim for l, k in zip(model.model.layers, kinds) if k == "sliding_attention")
    changed = 0
    for layer, kind in zip(model.model.layers, kinds):
        attn = layer.self_attn
        if kind == "full_attention":
            if attn.head_dim <= small:
                raise ValueError(f"full-attention head {attn.head_dim} is not larger than {small}")
            _override(attn, "forward", types.MethodType(_small_head_forward(small), attn), undo)
            changed += 1
    if not changed:
        raise ValueError("no full-attention layer")


def _softcapping(model, undo):
    old = model.config.final_logit_softcapping
    if not old:
        raise ValueError("the model has no final logit softcapping")
    model.config.final_logit_softcapping = None
    undo.append(lambda: setattr(model.config, "final_logit_softcapping", old))


REMOVALS = dict(zip(FEATURES, (_per_layer_inputs, _kv_sharing, _double_wide_mlp, _sliding_window,
                               _larger_full_head, _softcapping)))


@contextlib.contextmanager
def removed(model, feature: str):
    """The model with ``feature`` removed in place (parameters shared), restored on exit."""
    undo: list = []
    try:
        REMOVALS[feature](model, undo)
        yield model
    finally:
        for step in reversed(undo):
            step()


def without(model, feature: str | None):
    """A deep copy of the model with ``feature`` removed (None: nothing removed)."""
    m = copy.deepcopy(model)
    if feature is not None:
        REMOVALS[feature](m, [])
    return m
