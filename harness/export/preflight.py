"""Memory pre-flight: before loading, quantizing or lowering, estimate the process's peak RSS and
refuse (one line, with the override) when it exceeds the memory available, instead of swapping.

The deployment log lost 40 minutes to a swap storm: a 5.5B-parameter model's FP32 and INT4
copies on a 25 GB machine. Here the estimate comes from the parameter count, read without
loading any weights (safetensors headers for a checkpoint directory; the config on PyTorch's
meta device for ``bench`` and ``FILE.json``), and the recipe and stage:

    peak(stage) = BASE_MIB[recipe][stage] MiB + PER_BYTE[recipe][stage] * (FP32 bytes of the model)

``BASE_MIB`` is what the process holds whatever the model (Python, torch, transformers, torchao,
ExecuTorch and the lowering passes' own structures); ``PER_BYTE`` counts the model-sized copies
alive at the stage's peak. Both are calibrated against measured peak RSS (VmHWM of a fresh
process running the stages with an empty artifact cache, ``python -m harness.export.preflight
measure``) on the fixture and the benchmark model; the figures are in ``CALIBRATION``, and
``tests/test_preflight.py`` holds the estimate within 25% of a fresh measurement. The counts come
from harness/models/size.py.

Override: ``--skip-memory-check`` (export, demo, verify) or ``HARNESS_SKIP_MEMORY_CHECK=1``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path  # noqa: F401  (tests reach the repository through it)

from harness.errors import HarnessError
from harness.models.size import ModelSize, model_size, size_from_loaded  # noqa: F401  (the pre-flight's inputs)
from harness.recipes import Recipe, get_recipe

STAGES = ("load", "quantize", "export", "lower")
GiB = 1 << 30
MiB = 1 << 20
SKIP_ENV = "HARNESS_SKIP_MEMORY_CHECK"

# Peak RSS through each stage, cumulative (load → quantize → export → lower, as `harness export`
# runs them): BASE_MIB[recipe][stage] MiB + PER_BYTE[recipe][stage] × the model's FP32 bytes. Fitted to
# CALIBRATION below (the fixture fixes the base, the benchmark model the slope), rounded.
#  - load: the FP32 model itself (1.0). safetensors are memory-mapped, so right after loading an
#    FP32 checkpoint RSS has grown by less (the bench model: 12 MB of 282); the pages come in as
#    soon as anything reads the weights (the bench model loaded, then one HF generate: 691.7 MB
#    measured, 700 estimated), and a BF16 checkpoint (E2B) is converted outright.
#  - quantize (8da4w): the FP32 model, its deep copy and torchao's temporaries (2.4).
#  - export: the model plus the serialized and reloaded .pt2 (2.5 either recipe).
#  - lower: the edge program, XNNPACK's packed weights, the serialized buffer and the reloaded
#    .pte on top (6.3 for FP32; 3.25 for 8da4w, whose packed INT4 weights are small).
BASE_MIB = {
    "fp32": {"load": 398, "quantize": 398, "export": 496, "lower": 639},
    "8da4w": {"load": 398, "quantize": 398, "export": 521, "lower": 705},
}
PER_BYTE = {
    "fp32": {"load": 1.0, "quantize": 1.0, "export": 2.5, "lower": 6.3},
    "8da4w": {"load": 1.0, "quantize": 2.4, "export": 2.5, "lower": 3.25},
}

# Streamed (harness/export/stream.py), each stage's own peak: BASE + PER_BYTE x the quantized model's
# bytes (ModelSize.quantized_bytes, which counts the token table in FP32, as it is held while its
# two quantized uses are made). The fixture's streamed peaks fix the bases, the E2B-shaped
# checkpoint's the slopes (SCALE_CALIBRATION, ``python -m harness.bench.scale stages DIR RECIPE``):
#  - quantize: the quantized model, plus the FP32 token table and torchao's temporaries while
#    lm_head and the table are quantized from it (1.87);
#  - export: the model, torch.export's tracing, the pickled .pt2 and its verification reload (2.29);
#  - lower: the reloaded program, XNNPACK's copies of each partition and its packed weights, the
#    emitter's constant bytes (2.49); the serialized program is streamed to disk, never joined.
STREAMED_BASE_MIB = {"quantize": 405, "export": 542, "lower": 709}
STREAMED_PER_BYTE = {"quantize": 1.87, "export": 2.29, "lower": 2.49}
# A recipe that leaves the token table FP32 (8da4w: ``embedding`` None; 8da4w-fast makes it INT4)
# carries it as a program constant through export and lowering, where it is copied like the rest:
# at E2B size its 1.61 GB made the .pt2 1.22 GB larger and the stages' peaks 2.02 and 4.48 GB
# higher than 8da4w-fast's. Extra peak = STREAMED_FP32_TABLE x the FP32 bytes of what is neither a
# linear nor the per-layer table (the token table and the norms), fitted to SCALE_CALIBRATION.
STREAMED_FP32_TABLE = {"quantize": 0.0, "export": 1.25, "lower": 2.78}
# A recipe that stores the tied token table once (8da4w-fast: ``embedding`` "int4", exported through
# harness/export/fast/, lm_head reading the table through harness::q4_linear) gives XNNPACK no
# lm_head to pack: at E2B size its lowering peak fell from 16.28 to 14.32 GB (host B, the same day,
# both lean). Less peak = STREAMED_SHARED_TABLE x the same FP32 bytes, fitted to SCALE_CALIBRATION.
STREAMED_SHARED_TABLE = {"quantize": 0.0, "export": 0.0, "lower": 1.05}
# Each stage's own peak RSS in GB (10^9 bytes), VmHWM reset between stages, empty artifact cache:
# the fixture (quantized bytes 5.9 MB as counted) and the E2B-shaped checkpoint (6.13 GB), 8da4w-fast.
SCALE_CALIBRATION = {
    ("fixture", "8da4w-fast"): {"quantize": 0.425, "export": 0.568, "lower": 0.743},
    # 2026-12-05, host B, the table stored once (2026-12-04, host A, before: 11.88, 14.61, 16.03)
    ("e2b-shape", "8da4w-fast"): {"quantize": 11.61, "export": 14.43, "lower": 14.32},
    ("e2b-shape", "8da4w"): {"quantize": 11.25, "export": 16.63, "lower": 20.49},  # 2026-12-05, host B
}

# Measured peak RSS in MB (10^6 bytes) of a fresh process through each stage, empty artifact cache
# (``python -m harness.export.preflight measure SPEC RECIPE``; VmHWM), on this project's machine:
# x86_64, 2 cores, torch 2.13.0, executorch 1.5.1, torchao 0.18.0, transformers 5.24.0.
# FP32 bytes: the fixture 5.98 MB (1,495,360 parameters), the benchmark model 282.2 MB (70,549,632).
CALIBRATION = {
    ("fixture", "fp32"): {"load": 417.7, "quantize": 417.7, "export": 534.7, "lower": 707.3},
    ("fixture", "8da4w"): {"load": 417.7, "quantize": 432.2, "export": 560.6, "lower": 758.4},
    ("bench", "fp32"): {"load": 429.9, "quantize": 429.9, "export": 1212.2, "lower": 2447.0},
    ("bench", "8da4w"): {"load": 430.6, "quantize": 1099.0, "export": 1238.6, "lower": 1651.7},
}


# ---- the estimate and the check ----------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    size: ModelSize
    recipe: str
    stage: str
    peak_bytes: int

    def describe(self) -> str:
        return (f"{self.size.name} ({self.size.params / 1e6:,.1f}M parameters, {self.recipe}) needs about "
                f"{gib(self.peak_bytes)} of memory at its peak through {self.stage}")


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / MiB:.0f} MiB"


def _recipe(recipe) -> Recipe:
    return get_recipe(recipe) if isinstance(recipe, str) else recipe


def estimate(size: ModelSize, recipe, stage: str = "lower", streamed: bool = False) -> Estimate:
    """Peak RSS of a fresh process through ``stage`` (cumulative: load, quantize, export, lower);
    ``streamed``: the stage's own peak when the checkpoint is loaded quantized module by module
    (harness/export/stream.py), a multiple of the quantized model's bytes."""
    r = _recipe(recipe)
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r} not in {STAGES}")
    if streamed and r.quantizes:
        stage = "quantize" if stage == "load" else stage
        peak = STREAMED_BASE_MIB[stage] * MiB + STREAMED_PER_BYTE[stage] * size.quantized_bytes(r)
        table = 4 * (size.params - size.linear - size.per_layer_embedding)
        if r.embedding is None:
            peak += STREAMED_FP32_TABLE[stage] * table
        elif r.embedding == "int4" and r.export == "fast":
            peak -= STREAMED_SHARED_TABLE[stage] * table
        return Estimate(size, r.name, stage, int(peak))
    kind = "fp32" if r.linear is None and r.per_layer_embedding is None else "8da4w"
    peak = BASE_MIB[kind][stage] * MiB + PER_BYTE[kind][stage] * size.fp32_bytes
    return Estimate(size, r.name, stage, int(peak))


def disk_estimate(size: ModelSize, recipe) -> dict[str, int]:
    """Bytes the artifacts take: the .pt2 and the .pte in the cache (and the copy at --out)."""
    r = _recipe(recipe)
    q = size.quantized_bytes(r)
    packed = q if r.linear is None else q - size.linear * (0.5 + 5 / (r.group_size or 32) - 4 / 32)
    # measured: fixture fp32 .pt2 10.6 / .pte 6.7 MB, 8da4w 8.2 / 1.7; bench fp32 291 / 299 MB,
    # 8da4w 104 / 58 MB (the .pt2 also holds the KV cache buffers and graph; small models: mostly that)
    return {"pt2": int(q * 1.1) + 8 * MiB, "pte": int(packed * 1.1) + 2 * MiB}


def available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def current_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def skip_requested(skip: bool = False) -> bool:
    return skip or os.environ.get(SKIP_ENV, "") not in ("", "0")


def check(size: ModelSize, recipe, stage: str = "lower", skip: bool = False,
          available: int | None = None, rss: int | None = None, streamed: bool = False) -> Estimate:
    """Refuse (HarnessError, one line) if the estimated peak through ``stage`` needs more memory
    than is available now, beyond what this process already holds."""
    est = estimate(size, recipe, stage, streamed=streamed)
    if skip_requested(skip):
        return est
    avail = available_memory() if available is None else available
    held = current_rss() if rss is None else rss
    need = est.peak_bytes - held
    if need > avail:
        raise HarnessError(
            f"not enough memory: {est.describe()}, {gib(avail)} is available"
            + (f" beyond the {gib(held)} this process holds" if held > 256 * MiB else ""),
            "close other programs or use a machine with more memory; to try anyway (it may swap), "
            f"pass --skip-memory-check or set {SKIP_ENV}=1",
        )
    return est


# ---- the pipeline, checked before each stage that will run --------------------------------------
def checked_pipeline(model, recipe, settings=None, progress=None, until: str = "lower", skip: bool = False):
    """A Pipeline that runs the memory check before loading (for everything up to ``until``),
    before quantizing, and before exporting or lowering unless the artifact comes from the cache."""
    from harness.pipeline import Pipeline

    class MemoryCheckedPipeline(Pipeline):
        @cached_property
        def model_size(self) -> ModelSize:
            return model_size(self._model_spec)

        def memory_check(self, stage: str) -> None:
            if skip_requested(skip):
                return
            check(self.model_size, self.recipe, "quantize" if self.streamed and stage == "load" else stage,
                  streamed=self.streamed)

        def _cached(self, stage: str, filename: str) -> bool:
            return (self.cache.entry(stage, self._key(stage)) / filename).is_file()

        @cached_property
        def loaded(self):
            self.memory_check(until)
            return Pipeline.loaded.func(self)

        @cached_property
        def quantized(self):
            if self.recipe.linear is not None or self.recipe.per_layer_embedding is not None:
                self.memory_check("quantize")
            return Pipeline.quantized.func(self)

        @cached_property
        def pt2_path(self):
            if not self._cached("pt2", "program.pt2"):
                self.memory_check("export")
            return Pipeline.pt2_path.func(self)

        @cached_property
        def pte_path(self):
            if not self._cached("pte", "model.pte"):
                self.memory_check("lower")
            return Pipeline.pte_path.func(self)

    return MemoryCheckedPipeline(model, recipe, settings, progress=progress)


# ---- measurement (the calibration, and the test that holds the estimate to it) ------------------
def _peak_rss() -> int:
    from harness.rss import peak_rss_mb

    return int(peak_rss_mb() * MiB)


def measure(spec: str, recipe: str, until: str = "lower") -> dict:
    """Run the stages in this process (use a fresh process and an empty artifact cache) and
    return the peak RSS through each, in bytes."""
    from harness.pipeline import Pipeline

    pipe = Pipeline(spec, recipe)
    out: dict = {"spec": spec, "recipe": recipe}
    t0 = time.time()
    for stage, attr in (("load", "loaded"), ("quantize", "quantized"), ("export", "pt2_path"),
                        ("lower", "pte_path")):
        getattr(pipe, attr)
        out[stage] = _peak_rss()
        out[f"{stage}_seconds"] = round(time.time() - t0, 1)
        if stage == until:
            break
    out["built"] = [e[0] for e in pipe.cache.events if e[2] == "build"]
    return out


def measure_in_subprocess(spec: str, recipe: str, until: str = "lower", timeout: int = 1800) -> dict:
    """``measure`` in a fresh interpreter with an empty artifact cache (a temporary one, removed
    afterwards). For ``bench`` pass its checkpoint directory, so that the measured process loads it
    rather than generating its random weights."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="harness-measure-") as cache_dir:
        env = {**os.environ, "HARNESS_CACHE_DIR": cache_dir, "PYTHONWARNINGS": "ignore"}
        env.pop("HARNESS_NO_CACHE", None)
        res = subprocess.run([sys.executable, "-m", "harness.export.preflight", "measure", spec, recipe, until],
                             capture_output=True, text=True, env=env, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"measurement failed (exit {res.returncode}): {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "measure":
        print(json.dumps(measure(argv[1], argv[2], argv[3] if len(argv) > 3 else "lower")))
        return 0
    if len(argv) >= 1 and argv[0] == "estimate":
        size = model_size(argv[1] if len(argv) > 1 else "fixture")
        for recipe in (argv[2:] or ["fp32", "8da4w"]):
            print(json.dumps({"model": size.name, "params": size.params, "recipe": recipe,
                              **{s: estimate(size, recipe, s).peak_bytes for s in STAGES}}))
        return 0
    print("usage: python -m harness.export.preflight measure SPEC RECIPE [STAGE] | estimate [SPEC] [RECIPE...]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
