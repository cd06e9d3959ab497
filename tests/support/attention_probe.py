"""Observe the attention masks a model's attention layers actually receive.

``with AttentionProbe(model) as probe: ...`` records, for every attention call, the layer index,
its type (sliding/full) and how many key slots the *last* query may attend to. Tests compare that
with what the cache position implies: ``p + 1`` slots at position ``p`` (full attention) or
``min(p + 1, window)`` (sliding attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MaskObservation:
    layer: int
    layer_type: str
    query_len: int
    allowed_last_row: int


@dataclass
class AttentionProbe:
    model: object
    calls: list[MaskObservation] = field(default_factory=list)

    def __enter__(self):
        self._handles = []
        decoder = self.model.model
        types = self.model.config.layer_types
        for i, layer in enumerate(decoder.layers):
            self._handles.append(
                layer.self_attn.register_forward_pre_hook(self._hook(i, types[i]), with_kwargs=True)
            )
        return self

    def _hook(self, index: int, layer_type: str):
        import torch

        def hook(module, args, kwargs):
            mask = kwargs.get("attention_mask")
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            q = hidden.shape[1] if hidden is not None else -1
            if mask is None:
                allowed = -1
            else:
                row = mask[0, 0, -1] if mask.dim() == 4 else mask[-1]
                allowed = int(row.sum()) if row.dtype == torch.bool else int((row == 0).sum())
            self.calls.append(MaskObservation(index, layer_type, q, allowed))

        return hook

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        return False

    def decode_steps(self) -> list[list[MaskObservation]]:
        """Observations grouped per forward call (one entry per layer), decode calls only."""
        n_layers = len(self.model.model.layers)
        groups = [self.calls[i:i + n_layers] for i in range(0, len(self.calls), n_layers)]
        return [g for g in groups if g and g[0].query_len == 1]
