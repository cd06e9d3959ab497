"""Which layers store the keys and values other layers reuse (Gemma 4's KV sharing), from any
transformers release the harness meets.

transformers 5.23 added ``Gemma4TextConfig.kv_sharing_modes`` (None, "store" or "reuse" per layer);
5.22 has only ``num_kv_shared_layers`` and decides the same thing inside each attention layer: the
last ``num_kv_shared_layers`` layers reuse, and the last earlier layer of each attention type stores
(``store_full_length_kv``). Without this, the fast path stopped at an AttributeError on 5.22 (the
compatibility matrix, docs/compatibility-matrix.md).
"""

from __future__ import annotations


def kv_sharing_modes(config) -> list[str | None]:
    modes = getattr(config, "kv_sharing_modes", None)
    if modes is not None:
        return list(modes)
    n = int(config.num_hidden_layers)
    types = list(config.layer_types)
    first = n - int(getattr(config, "num_kv_shared_layers", 0) or 0)
    out: list[str | None] = [None if i < first else "reuse" for i in range(n)]
    for kind in set(types):
        earlier = [i for i in range(first) if types[i] == kind]
        if earlier:
            out[earlier[-1]] = "store"
    return out
