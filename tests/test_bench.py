"""Host benchmark tier: every runtime on the benchmark-size model, side by side, in one run.

    pytest -m bench --benchmark-json out.json && harness bench report out.json

Each test loads one runtime, checks its answers outside the timed call, then times the protocol
(5 prompts × 3 rounds, one warm-up pass excluded). Load time and peak RSS come from a fresh child
process per runtime; the roofline from this run's own bandwidth measurement. A runtime whose build
step fails (no llama-cpp-python, an architecture llama.cpp cannot convert, ...) fails its own test
with the reason, which the JSON's "harness" section records; the others still run.
"""

from __future__ import annotations

import pytest

from harness.runtimes.base import RuntimeSpec

from harness.bench.protocol import NATIVE
from harness.bench.suite import (
    COUNTERPART, Protocol, check_deterministic, child_figures, confident_divergence, host_runtimes,
    matching_prefix, run_benchmark,
)
from harness.tolerances import tolerance
from support import skip_without_llama_cpp

pytestmark = pytest.mark.bench

MODEL = "bench"


@pytest.fixture(scope="module")
def protocol(pipeline):
    return Protocol.host(vocab=pipeline("fp32", model=MODEL).loaded.config.vocab_size)


@pytest.fixture(scope="module")
def references(pipeline, protocol):
    """Eager greedy ids and logits (no EOS stop) for every prompt: FP32, and each recipe's own
    quantized model; the yardsticks each runtime's answers are checked against."""
    from harness.runtimes.base import greedy

    cache: dict = {}

    def get(recipe: str):
        if recipe not in cache:
            pipe = pipeline(recipe, model=MODEL)
            step_for = lambda: pipe.eager_step(quantized=recipe != "fp32")  # noqa: E731
            cache[recipe] = [greedy(step_for(), p, protocol.new_tokens) for p in protocol.prompts]
        return cache[recipe]

    return get


def artifact_for(runtime: str, pipeline) -> tuple[str, object]:
    """(artifact path or model spec, the torch model its bytes/token are counted on or a GGUF)."""
    kind, recipe = RuntimeSpec.parse(runtime)
    if kind == "eager":
        pipe = pipeline("fp32", model=MODEL)
        return MODEL, pipe.loaded.model
    if kind in ("executorch", NATIVE):
        pipe = pipeline(recipe, model=MODEL)
        return str(pipe.pte_path), pipe.quantized
    from harness.runtimes.gguf import gguf_for

    path = gguf_for(MODEL, recipe)
    return str(path), path


def counterpart_for(runtime: str, protocol):
    """The llama.cpp counterpart of a PyTorch/ExecuTorch runtime, loaded in its own process to run
    in alternating rounds (``run_benchmark(paired=...)``); (None, why) when there is none."""
    kind, recipe = RuntimeSpec.parse(runtime)
    other = COUNTERPART.get(recipe)
    if kind == "llama.cpp" or not other:
        return None, None
    try:
        import llama_cpp  # noqa: F401

        from harness.runtimes.process import isolated
        from harness.runtimes.gguf import gguf_for

        return (other, isolated(RuntimeSpec.parse(other).kind, str(gguf_for(MODEL, RuntimeSpec.parse(other).recipe)), protocol.threads)), None
    except Exception as e:  # the row is still measured, its ratio is then row over row
        return None, f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("runtime", host_runtimes())
def test_host_benchmark(benchmark, runtime, pipeline, protocol, references, bench_bandwidth, bench_failures):
    from pathlib import Path

    from harness.runtimes.process import isolated
    from harness.bench.roofline import gguf_bytes_per_token, torch_bytes_per_token

    kind, recipe = RuntimeSpec.parse(runtime)
    if kind == "llama.cpp":
        skip_without_llama_cpp()
    try:
        artifact, counted = artifact_for(runtime, pipeline)
        runner = isolated(RuntimeSpec.parse(runtime).kind, artifact, protocol.threads)  # timed alone
    except Exception as e:  # recorded in the JSON's harness section, then failed: the rest still run
        bench_failures[runtime] = f"{type(e).__name__}: {e}"
        pytest.fail(f"{runtime}: could not build or load: {e}")

    paired, pair_error = counterpart_for(runtime, protocol)
    try:
        passes = run_benchmark(benchmark, runner, protocol, paired=paired)
    finally:
        runner.close()
        if paired:
            paired[1].close()

    # correctness, outside the timed call
    check_deterministic(passes, runtime)
    config = pipeline("fp32", model=MODEL).loaded.config
    # each .pte against the eager run of its own recipe's quantized model; llama.cpp F32 against FP32
    ref_recipe = ("fp32" if recipe in ("fp32", "f32") or kind == "eager"
                  else (recipe if kind in ("executorch", NATIVE) else None))
    fp32_ref = references("fp32")
    info = benchmark.extra_info
    info.update(runtime=runtime, model=MODEL, recipe=recipe, kind=kind)
    if pair_error:
        info["paired_error"] = pair_error
    info["ref_prefix_tokens"] = sum(matching_prefix(r.ids, s.ids) for r, s in zip(fp32_ref, passes[0])) / len(fp32_ref)
    if ref_recipe:
        refs = references(ref_recipe)
        tol = tolerance("bench/llamacpp_f32_vs_eager" if kind == "llama.cpp" else f"bench/pte_vs_eager/{ref_recipe}").atol
        for i, (ref, sample) in enumerate(zip(refs, passes[0])):
            problem = confident_divergence(ref.ids, ref.step_logits, sample.ids, tol)
            assert problem is None, f"{runtime}, prompt {i} vs eager {ref_recipe}: {problem}"

    # memory and load time from a fresh process; the roofline from this run's bandwidth
    info.update({k: v for k, v in child_figures(runtime, artifact, protocol).items() if k != "generation"})
    context = len(protocol.prompts[0]) + protocol.new_tokens // 2
    per_token = (gguf_bytes_per_token(counted, config, context) if kind == "llama.cpp"
                 else torch_bytes_per_token(counted, context))
    roof = bench_bandwidth.read_gb_s * 1e9 / per_token
    info.update(bytes_per_token=per_token, bandwidth_gb_s=bench_bandwidth.read_gb_s,
                roofline_tok_s=roof, roofline_fraction=info["decode_tok_s"] / roof,
                artifact_mb=Path(artifact).stat().st_size / 1e6 if Path(artifact).is_file() else None,
                counterpart=COUNTERPART.get(recipe, ""))
    if info.get("artifact_mb") is None:
        info.pop("artifact_mb")
    if kind == "executorch":  # ExecuTorch's C++ LLM runner on the same .pte: its own timings
        from harness.bench.suite import runner_figures
        from harness.goldens.store import FIXTURE_PROMPTS

        pipe = pipeline(recipe, model=MODEL)
        texts = [pipe.loaded.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                           tokenize=False) for p in FIXTURE_PROMPTS[:5]]
        info.update(runner_figures(artifact, str(pipe.loaded.directory / "tokenizer.json"), texts,
                                   protocol.new_tokens, protocol.rounds))
