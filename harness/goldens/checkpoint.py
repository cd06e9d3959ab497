"""The golden set of a user's checkpoint, computed stage by stage within 16 GiB at E2B size:

1. the reference: transformers' ``generate`` on the checkpoint in its own dtype (bf16 for Gemma 4;
   FP32 at E2B is 18.5 GB of weights alone). Freed before anything else is loaded.
2. for each recipe, streamed at E2B size (harness/export/stream.py): ``eager`` (the quantized model
   through the export wrapper) for every prompt; torchao's codes and scales; the ``.pt2`` built (or
   taken from the cache), the in-memory model released; ``exported`` (the reloaded ``.pt2``) for
   every prompt; the program dropped; the ``.pte`` lowered (or cached) and run through ExecuTorch's
   Python runtime for every prompt; then ``native``: the same ``.pte`` through the harness's
   torch-free native runner (harness/runtimes/cpp), what the Pi 5 bundle runs (ids only: it reports
   no logits, so its golden is its tokens, held to the ``pte`` stage's by the gate).

Each stage is timed and its peak RSS taken in a window of its own (Linux clear_refs), printed as it
finishes and recorded in the model's provenance.
"""

from __future__ import annotations

import gc
import time

from harness.errors import HarnessError
from harness.goldens.activations import activation_goldens
from harness.goldens.store import MAX_NEW_TOKENS, prompt_record, quantize_record
from harness.goldens.subject import Subject

GIB = 1 << 30


class _Stage:
    """Times a stage and measures its own peak RSS window."""

    def __init__(self, stats: dict, name: str, progress):
        self.stats, self.name, self.progress = stats, name, progress

    def __enter__(self):
        from harness.bench.scale import reset_peak

        reset_peak()
        self.t0 = time.time()
        return self

    def __exit__(self, *exc):
        from harness.rss import peak_rss_mb

        if exc[0] is None:
            row = {"seconds": round(time.time() - self.t0, 1), "peak_rss_gib": round(peak_rss_mb() / 1024, 2)}
            self.stats[self.name] = row
            self.progress(f"{self.name}: {row['seconds']} s, peak RSS {row['peak_rss_gib']} GiB")


def reference_memory_check(subject: Subject, skip: bool = False) -> None:
    """The reference holds the whole checkpoint in its own dtype: refuse in one line where it
    cannot fit (the pre-flight for the recipes is harness/export/preflight.py's)."""
    import psutil

    from harness.export.preflight import skip_requested
    from harness.models.size import model_size

    if skip_requested(skip):
        return
    size = model_size(subject.spec)
    need = size.params * (4 if subject.reference.endswith("fp32") else 2) * 1.15 + 1.5 * GIB
    have = psutil.virtual_memory().available
    if need > have:
        raise HarnessError(f"the {subject.reference} reference of {subject.key} needs about {need / GIB:.1f} GiB, "
                           f"{have / GIB:.1f} GiB is available",
                           "close other programs, or run on a machine with more memory (HARNESS_SKIP_MEMORY_CHECK=1 overrides)")


def native_runs(pte_path, recipe: str, prompt_ids: dict, eos) -> dict:
    """Each prompt's greedy ids through the native runner (its own process, its own C++ loop)."""
    from harness.runtimes.native import NativeRuntime

    runtime = NativeRuntime(pte_path)
    try:
        return {(recipe, "native", prompt): runtime.generate(ids, MAX_NEW_TOKENS, eos_ids=frozenset(eos))
                for prompt, ids in prompt_ids.items()}
    finally:
        runtime.close()


def compute_checkpoint(subject: Subject, progress=print, skip_memory_check: bool = False):
    from harness.export.preflight import checked_pipeline
    from harness.goldens.provenance import current_provenance
    from harness.goldens.write import Computed
    from harness.models.load import checkpoint_dtype, load_directory
    from harness.pipeline import encode_prompt, transformers_generate
    from harness.program import ExportSettings, eos_ids
    from harness.rss import return_freed_memory

    stats: dict = {}
    runs: dict = {}
    prompts = subject.prompts
    reference_memory_check(subject, skip_memory_check)
    progress(f"{subject.reference}:hf_generate: transformers on {subject.key} in {checkpoint_dtype(subject.spec)} ...")
    with _Stage(stats, f"{subject.reference}:hf_generate", progress):
        ref = load_directory(subject.spec, dtype=checkpoint_dtype(subject.spec))
        tokenizer = ref.tokenizer
        for prompt in prompts:
            runs[(subject.reference, "hf_generate", prompt)] = transformers_generate(
                ref.model, ref, encode_prompt(tokenizer, prompt), MAX_NEW_TOKENS)
        prompt_records = {p: prompt_record(p, tokenizer) for p in prompts}
        del ref
        gc.collect()
        return_freed_memory()

    quantized, acts, localized = {}, {}, {}
    settings = ExportSettings(max_context=subject.max_context)
    for recipe in subject.recipes:
        pipe = checked_pipeline(subject.spec, recipe, settings, progress=progress, until="lower", skip=skip_memory_check)
        with _Stage(stats, f"{recipe}:eager", progress):
            for prompt in prompts:
                runs[(recipe, "eager", prompt)] = pipe.generate(prompt, stage="eager", max_new_tokens=MAX_NEW_TOKENS)
            quantized[recipe] = quantize_record(pipe.quantized, digest_scales=True)
            recorded, moved = activation_goldens(
                lambda r: pipe.quantized, {p: prompt_records[p]["ids"] for p in prompts},
                {(recipe, p): runs[(recipe, "eager", p)].ids for p in prompts}, subject.key, (recipe,))
            acts.update(recorded)
            localized.update(moved)
        with _Stage(stats, f"{recipe}:export (.pt2)", progress):
            pipe.pt2_path
            pipe.release_model()
        with _Stage(stats, f"{recipe}:exported", progress):
            for prompt in prompts:
                runs[(recipe, "exported", prompt)] = pipe.generate(prompt, stage="exported", max_new_tokens=MAX_NEW_TOKENS)
            pipe.__dict__.pop("exported", None)
            gc.collect()
            return_freed_memory()
        with _Stage(stats, f"{recipe}:lower (.pte)", progress):
            pipe.pte_path
        with _Stage(stats, f"{recipe}:pte", progress):
            for prompt in prompts:
                runs[(recipe, "pte", prompt)] = pipe.generate(prompt, stage="pte", max_new_tokens=MAX_NEW_TOKENS)
        pipe.__dict__.pop("runner", None)
        gc.collect()
        with _Stage(stats, f"{recipe}:native", progress):
            runs.update(native_runs(pipe.pte_path, recipe, {p: runs[(recipe, "pte", p)].prompt_ids for p in prompts},
                                    eos_ids(pipe.loaded)))
        del pipe
        gc.collect()
        return_freed_memory()
    return Computed(runs, prompt_records, {}, quantized, tokenizer, current_provenance(subject=subject), subject, stats,
                    activations=acts, localized=localized)
