"""The benchmark suite both tiers share: build (or find) each runtime's artifact, run the protocol
of harness.bench.protocol under pytest-benchmark, check correctness outside the timed call, and put every
figure into ``benchmark.extra_info``.

Host tier (``bench``): the benchmark-size model (harness/models/bench.py) built here, all runtimes
side by side in one run. Pi 5 tier (``pi5``): the same protocol over a bundle built on a
workstation (``harness bench bundle DIR``), where the device needs no transformers.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

from harness.bench.protocol import (
    DEFAULT_NEW_TOKENS, DEFAULT_PROMPT_TOKENS, DEFAULT_PROMPTS, DEFAULT_ROUNDS, NATIVE, bench_prompts, medians,
)
from harness.errors import HarnessError
from harness.runtimes.base import Generation, Runtime, RuntimeSpec

# (runtime, the llama.cpp runtime of the same weight class it is compared with)
HOST_RUNTIMES = ("eager:fp32", "executorch:fp32", "executorch:8da4w", "llama.cpp:f32", "llama.cpp:q4_0")
COUNTERPART = {"fp32": "llama.cpp:f32", "8da4w": "llama.cpp:q4_0", "8da4w-fast": "llama.cpp:q4_0"}


def host_runtimes() -> list[str]:
    from harness.recipes import RECIPES

    extra = [f"executorch:{name}" for name in RECIPES if name not in ("fp32", "8da4w")]
    native = [f"{NATIVE}:{name}" for name in RECIPES]  # every .pte again, without Python or libtorch
    return list(HOST_RUNTIMES[:3]) + extra + native + list(HOST_RUNTIMES[3:])


@dataclass
class Protocol:
    prompts: list[list[int]]
    new_tokens: int = DEFAULT_NEW_TOKENS
    rounds: int = DEFAULT_ROUNDS
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)

    @classmethod
    def host(cls, vocab: int, n_prompts: int | None = None, prompt_tokens: int | None = None,
             new_tokens: int | None = None, rounds: int | None = None, threads: int | None = None):
        env = os.environ.get
        return cls(
            prompts=bench_prompts(int(n_prompts or env("HARNESS_BENCH_PROMPTS", DEFAULT_PROMPTS)),
                                  int(prompt_tokens or env("HARNESS_BENCH_PROMPT_TOKENS", DEFAULT_PROMPT_TOKENS)),
                                  vocab),
            new_tokens=int(new_tokens or env("HARNESS_BENCH_NEW_TOKENS", DEFAULT_NEW_TOKENS)),
            rounds=int(rounds or env("HARNESS_BENCH_ROUNDS", DEFAULT_ROUNDS)),
            threads=int(threads or env("HARNESS_BENCH_THREADS", 0) or os.cpu_count() or 1),
        )


def run_benchmark(benchmark, runner: Runtime, protocol: Protocol, power=None, paired=None) -> list[list[Generation]]:
    """Time ``rounds`` passes over every prompt (one warm-up pass first, excluded); returns the
    measured rounds' samples. With a power reader, energy is integrated over the measured rounds.

    ``paired=(runtime, runner)``: before each round, untimed by pytest-benchmark, one pass of that
    counterpart (its own warm-up first), so both are measured in the same minutes and
    ``paired_ratio_decode`` / ``paired_ratio_prefill`` hold up on a machine whose speed drifts (a
    shared VM measured llama.cpp Q4_0 at 409 and at 196 decode tok/s in two runs). Not with a
    power reader: the energy window would hold the counterpart's work too."""
    from harness.bench.device import PowerSampler

    if paired and power:
        raise HarnessError("a paired counterpart and an energy reading cannot share the measured rounds",
                           "measure energy without a counterpart")
    passes: list[list[Generation]] = []
    other: list[list[Generation]] = []

    def one_pass():
        passes.append([runner.generate(p, protocol.new_tokens) for p in protocol.prompts])

    def counterpart_pass():
        other.append([paired[1].generate(p, protocol.new_tokens) for p in protocol.prompts])

    one_pass()  # warm-up, outside pytest-benchmark's rounds and outside the energy window
    passes.clear()
    if paired:
        counterpart_pass()
        other.clear()
    sampler = PowerSampler(power) if power else None
    timed = dict(rounds=protocol.rounds, iterations=1, warmup_rounds=0)
    if paired:
        timed["setup"] = counterpart_pass
    if sampler:
        with sampler:
            benchmark.pedantic(one_pass, **timed)
    else:
        benchmark.pedantic(one_pass, **timed)
    samples = [s for p in passes for s in p]
    info = benchmark.extra_info
    info.update(medians(samples))
    info.update(threads=protocol.threads, prompts=len(protocol.prompts), rounds=protocol.rounds,
                prompt_tokens=statistics.median(len(p) for p in protocol.prompts),
                new_tokens=protocol.new_tokens)
    if paired:
        theirs = medians([s for p in other for s in p])
        info.update(paired_runtime=paired[0], paired_decode_tok_s=theirs["decode_tok_s"],
                    paired_prefill_tok_s=theirs["prefill_tok_s"],
                    paired_ratio_decode=info["decode_tok_s"] / theirs["decode_tok_s"],
                    paired_ratio_prefill=info["prefill_tok_s"] / theirs["prefill_tok_s"])
    if sampler and sampler.joules is not None:
        generated = sum(s.new_tokens for s in samples)
        info.update(energy_j=sampler.joules, j_per_token=sampler.joules / generated,
                    mean_w=sampler.mean_watts)
    return passes


def check_deterministic(passes: list[list[Generation]], runtime: str) -> None:
    """Every round gives every prompt the same ids (greedy is deterministic)."""
    for i, first in enumerate(passes[0]):
        for r, other in enumerate(passes[1:], start=1):
            if other[i].ids != first.ids:
                at = next(k for k, (a, b) in enumerate(zip(first.ids, other[i].ids)) if a != b)
                raise AssertionError(f"{runtime}: prompt {i} gave other ids in round {r} "
                                     f"(position {at}: {first.ids[at]} vs {other[i].ids[at]})")


def confident_divergence(ref_ids: list[int], ref_logits: list, ids: list[int], tol: float) -> str | None:
    """Where ``ids`` leave the reference at a position whose reference margin exceeds ``tol``
    (a real disagreement, not a near-tie flip), a message; else None. After a near-tie flip the
    two sequences condition on different tokens, so the comparison stops there."""
    for k, (a, b) in enumerate(zip(ref_ids, ids)):
        if a == b:
            continue
        margin = float(ref_logits[k][a] - ref_logits[k][b])
        if margin > tol:
            return (f"position {k}: reference {a}, got {b}; the reference prefers {a} by "
                    f"{margin:.4f} logits > tolerance {tol}")
        return None
    return None


def matching_prefix(ref_ids: list[int], ids: list[int]) -> int:
    return next((k for k, (a, b) in enumerate(zip(ref_ids, ids)) if a != b), min(len(ref_ids), len(ids)))


def settle(seconds: float = 0.0) -> None:
    if seconds:
        time.sleep(seconds)


def child_figures(runtime: str, artifact: str, protocol: Protocol, runner: list[str] | None = None) -> dict:
    from harness.runtimes.process import measure_once

    try:
        return measure_once(RuntimeSpec.parse(runtime).kind, artifact, protocol.threads, protocol.prompts[0],
                            protocol.new_tokens, runner=runner)
    except HarnessError as e:
        return {"child_error": str(e)}


def runner_figures(pte: str, tokenizer_json: str, texts: list[str], new_tokens: int, rounds: int) -> dict:
    """ExecuTorch's own LLM runner (C++ TextLLMRunner) over chat-templated texts, in a process of
    its own (like every timed runtime, see ``harness.runtimes.process``): its own
    prefill/decode rates and time to first token, measured in C++ (medians), and its load time."""
    import json

    import sys

    from harness.runtimes.process import run_json

    return run_json([sys.executable, "-m", "harness.bench.worker", str(pte), str(tokenizer_json), str(new_tokens),
                     str(rounds)], f"ExecuTorch's LLM runner on {pte}", stdin=json.dumps(texts), timeout=1800)


def runner_figures_here(pte: str, tokenizer_json: str, texts: list[str], new_tokens: int, rounds: int) -> dict:
    """``runner_figures`` in this process (the benchmark worker calls it)."""
    from harness.runtimes.llm_runner import TextLLMRuntime

    runner = TextLLMRuntime(pte, tokenizer_json)
    load_s = runner.load_s
    runner.generate_text(texts[0], new_tokens, map_ids=False)  # warm-up
    stats = [runner.generate_text(t, new_tokens, map_ids=False).stats for _ in range(rounds) for t in texts]
    med = lambda k: statistics.median(s[k] for s in stats if s.get(k) is not None)  # noqa: E731
    return {"runner_prefill_tok_s": med("prefill_tok_s"), "runner_decode_tok_s": med("decode_tok_s"),
            "runner_ttft_s": med("ttft_s"), "runner_load_s": load_s,
            "runner_generated_tokens": med("generated_tokens")}
