"""A hand-written decode loop over transformers' forward with an explicit 2D attention mask: the
deployment log's loop, kept as a stage so its mask bug stays caught.

``mask="growing"`` passes ``ones(1, p + 1)`` at a decode step at position ``p`` (correct);
``mask="single"`` passes ``ones(1, 1)``, the log's bug ("Theodore 2000000"): the new query then
attends to one slot instead of the whole cache.
"""

from __future__ import annotations

from harness.generate import Generation


def cache_kwarg(model) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` in 5.24. An unknown keyword is
    swallowed by ``**kwargs``, so passing the wrong one silently runs without a cache: each decode
    step then attends to itself alone (found by the refresh flow under 5.23.0)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def hf_loop_generate(model, prompt_ids: list[int], max_new_tokens: int, eos_ids=frozenset(),
                     mask: str = "growing") -> Generation:
    import torch
    from transformers import DynamicCache

    if mask not in ("growing", "single"):
        raise ValueError(mask)
    cache = DynamicCache(config=model.config)
    kw = cache_kwarg(model)
    n = len(prompt_ids)
    gen = Generation(prompt_ids=list(prompt_ids))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt_ids]), attention_mask=torch.ones(1, n, dtype=torch.long),
                    use_cache=True, **{kw: cache})
        gen.cache_positions.append(0)
        gen.mask_slots.append(n)
        pos = n
        for i in range(max_new_tokens):
            last = out.logits[0, -1].clone()
            nxt = int(last.argmax())
            gen.ids.append(nxt)
            gen.step_logits.append(last)
            if nxt in eos_ids:
                gen.stopped_on_eos = True
                break
            if i == max_new_tokens - 1:
                break
            width = pos + 1 if mask == "growing" else 1
            out = model(input_ids=torch.tensor([[nxt]]), attention_mask=torch.ones(1, width, dtype=torch.long),
                        position_ids=torch.tensor([[pos]]), use_cache=True, **{kw: cache})
            gen.cache_positions.append(pos)
            gen.mask_slots.append(width)
            pos += 1
    return gen
