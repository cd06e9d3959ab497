"""The benchmark protocol (from the deployment log): each prompt generated greedily, a fixed number
of new tokens, timed as prefill (the whole prompt in one call), time to first token, and decode
(one token per call); medians over prompts × rounds, warm-up excluded.

Each runtime (harness/runtimes; named by ``RuntimeSpec`` labels: ``eager:fp32``,
``executorch:RECIPE``, ``executorch-native:RECIPE``, ``llama.cpp:f32|q4_0``) is timed by its own
``generate``, the greedy loop the goldens check, in a process of its own
(``harness.runtimes.process.isolated``), all with the same number of threads; load time and peak
RSS come from one more fresh process (``measure_once``), so one runtime's threads, caches and
memory never count against another's.
"""

from __future__ import annotations

import statistics

DEFAULT_PROMPTS = 5
DEFAULT_PROMPT_TOKENS = 32
DEFAULT_NEW_TOKENS = 64
DEFAULT_ROUNDS = 3
NATIVE = "executorch-native"


def bench_prompts(n: int = DEFAULT_PROMPTS, length: int = DEFAULT_PROMPT_TOKENS, vocab: int = 8192,
                  bos: int = 2, seed: int = 0) -> list[list[int]]:
    """``n`` seeded random prompts of ``length`` ids (``<bos>`` first) for the random-weight model."""
    import random

    rng = random.Random(seed)
    return [[bos] + [rng.randrange(6, vocab) for _ in range(length - 1)] for _ in range(n)]


def medians(samples) -> dict:
    """Medians over Generations (harness.runtimes.base.Generation)."""
    return {
        "prefill_tok_s": statistics.median(s.prefill_tok_s for s in samples),
        "decode_tok_s": statistics.median(s.decode_tok_s for s in samples),
        "ttft_s": statistics.median(s.ttft_s for s in samples),
        "samples": len(samples),
    }
