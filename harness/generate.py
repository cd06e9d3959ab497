"""Generate stage: greedy decoding over any step function, prefill then decode.

``step(input_ids[1, s], cache_position[s]) -> logits[1, s, V]`` is the exported program's
signature; the eager wrapper, the ExportedProgram and the ``.pte`` all provide it. Prefill feeds
the whole prompt in one call; each decode step feeds one token at ``cache_position = [p]``, so
the attention admits exactly ``p + 1`` cache slots (``harness.attention_probe`` observes that
inside the model). Generation stops after an EOS id (kept in the output, as
``model.generate`` does) or after ``max_new_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from harness.errors import HarnessError


@dataclass
class Generation:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    step_logits: list = field(default_factory=list)  # [V] float tensor per generated token
    prefill_logits: object = None  # [n, V]: every prompt position
    cache_positions: list[int] = field(default_factory=list)  # position of each call's first token
    stopped_on_eos: bool = False


StepFn = Callable[[object, object], object]


def greedy(
    step: StepFn,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_ids: set[int] | frozenset = frozenset(),
    max_context: int | None = None,
    vocab_size: int | None = None,
    keep_prefill_logits: bool = False,
) -> Generation:
    import torch

    from harness.export import ExportSettings, check_call

    n = len(prompt_ids)
    if max_context is not None:
        settings = ExportSettings(max_context=max_context)
        check_call(n, 0, settings, vocab_size or 1 << 62, ids=prompt_ids if vocab_size else None)
        if n + max_new_tokens - 1 > max_context:
            raise HarnessError(
                f"prompt ({n} tokens) + {max_new_tokens} new tokens exceed the exported maximum "
                f"context of {max_context}",
                "shorten the prompt or lower --max-new-tokens",
            )
    elif n < 1:
        raise HarnessError("empty prompt", "pass a non-empty prompt")
    gen = Generation(prompt_ids=list(prompt_ids))
    with torch.no_grad():
        logits = step(torch.tensor([prompt_ids], dtype=torch.long), torch.arange(n, dtype=torch.long))
        gen.cache_positions.append(0)
        if keep_prefill_logits:
            gen.prefill_logits = logits[0].clone()
        pos = n
        for i in range(max_new_tokens):
            last = logits[0, -1].clone()
            nxt = int(last.argmax())
            gen.ids.append(nxt)
            gen.step_logits.append(last)
            if nxt in eos_ids:
                gen.stopped_on_eos = True
                break
            if i == max_new_tokens - 1:
                break
            logits = step(torch.tensor([[nxt]], dtype=torch.long), torch.tensor([pos], dtype=torch.long))
            gen.cache_positions.append(pos)
            pos += 1
    return gen
