"""A hand-written decode loop over transformers' forward with an explicit 2D attention mask: the
deployment log's loop, kept as a stage so its mask bug stays caught.

``mask="growing"`` passes ``ones(1, p + 1)`` at a decode step at position ``p`` (correct);
``mask="single"`` passes ``ones(1, 1)``, the log's bug ("Theodore 2000000"): the new query then
attends to one slot instead of the whole cache.
"""

from __future__ import annotations

from harness.runtimes.base import Generation, greedy


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

    def step(ids: list[int], positions: list[int]):
        end = positions[-1] + 1
        decode = len(ids) == 1 and end > 1
        width = 1 if (decode and mask == "single") else end
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, width, dtype=torch.long),
                         position_ids=torch.tensor([positions]), use_cache=True, **{kw: cache}).logits

    return greedy(step, list(prompt_ids), max_new_tokens, eos_ids=eos_ids)
