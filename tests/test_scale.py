"""The real size (the ``scale`` tier, never in CI): a Gemma 4 E2B-shaped checkpoint through every
stage of the same pipeline, measured, in a laptop's memory, and side by side with llama.cpp.

    harness make-checkpoint --shape e2b DIR          # 9.3 GB of seeded BF16 weights, ~2 min
    HARNESS_SCALE_DIR=DIR pytest -m scale -s          # 23-26 min on 2 cores

Each measurement runs in a fresh process (``python -m harness.bench.scale``) with its own empty
artifact cache, so peaks are the stage's own; every figure goes to ``HARNESS_SCALE_OUT``
(default ``scale-report.json``), which the README's tables are made from. Speed is recorded, not
asserted (benchmarks record numbers; the README reads the ratio).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import HarnessError

SCALE_DIR = os.environ.get("HARNESS_SCALE_DIR")
OUT = Path(os.environ.get("HARNESS_SCALE_OUT", "scale-report.json"))
RECIPE = "8da4w-fast"
LAPTOP_BYTES = 16 << 30  # the issue's target: a 16 GB laptop (16 GiB of memory, as laptops are sized)

needs_dir = pytest.mark.skipif(not SCALE_DIR or not Path(SCALE_DIR).is_dir(),
                               reason="set HARNESS_SCALE_DIR to a checkpoint directory (harness make-checkpoint "
                                      "--shape e2b DIR, or a real Gemma 4 E2B snapshot) to run the scale tier")
pytestmark = [pytest.mark.scale, needs_dir]


def record(section: str, value) -> None:
    report = json.loads(OUT.read_text()) if OUT.is_file() else {}
    report[section] = value
    OUT.write_text(json.dumps(report, indent=1) + "\n")


def scale_command(*args: str, cache: Path) -> dict:
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache), "PYTHONWARNINGS": "ignore"}
    res = subprocess.run([sys.executable, "-m", "harness.bench.scale", *args], capture_output=True, text=True,
                         env=env, timeout=4 * 3600)
    assert res.returncode == 0, f"harness.bench.scale {' '.join(args)} failed: {res.stderr[-3000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One artifact cache for the tier: the stages build into it, agreement and speed read it."""
    return Path(os.environ.get("HARNESS_SCALE_CACHE") or tmp_path_factory.mktemp("scale-cache"))


@pytest.fixture(scope="module")
def stages(cache):
    res = scale_command("stages", SCALE_DIR, RECIPE, cache=cache)
    record("stages", res)
    return res


def test_every_stage_fits_a_16_gb_laptop(stages):
    for stage, row in stages["stages"].items():
        assert row["peak_rss_bytes"] <= LAPTOP_BYTES, (
            f"{stage} peaked at {row['peak_rss_bytes'] / (1 << 30):.2f} GiB, past a 16 GiB laptop's memory")


def test_the_preflight_estimates_every_stage_within_its_tolerance(stages):
    from harness.tolerances import tolerance

    tol = tolerance("preflight/scale").atol
    for stage, row in stages["stages"].items():
        err = abs(row["estimate_bytes"] - row["peak_rss_bytes"]) / row["peak_rss_bytes"]
        assert err <= tol, (f"{stage}: the pre-flight estimated {row['estimate_bytes'] / 1e9:.2f} GB, "
                            f"measured {row['peak_rss_bytes'] / 1e9:.2f} GB ({err:.0%} off > {tol:.0%})")


def test_fp32_is_refused_before_loading_in_one_line():
    """FP32 at this size needs its 18.5 GB of weights several times over through lowering: the
    pre-flight refuses it on a 16 GB laptop with its one line, before anything is read."""
    from harness.export.preflight import check
    from harness.models.size import model_size

    with pytest.raises(HarnessError) as e:
        check(model_size(SCALE_DIR), "fp32", "lower", available=LAPTOP_BYTES, rss=0)
    assert "not enough memory" in str(e.value) and "\n" not in str(e.value)


def test_the_pte_agrees_with_eager_past_the_sliding_window(stages, cache):
    """Logits within ``scale/pte_vs_eager/RECIPE`` at every step and the same ids wherever the
    margin allows, on real weights and on generated ones alike. A generated checkpoint must hold
    the current weight scheme (an older one is chaotic: its .pte and eager part from rounding
    alone), and there the .pte is also held to what a 1e-6 nudge of the embeddings moves eager
    itself, so that the logit tolerance is seen to be no looser than rounding."""
    from harness.tolerances import tolerance
    from harness.training.synthetic import is_synthetic, stale_weights

    synthetic = is_synthetic(Path(SCALE_DIR))
    if synthetic and (why := stale_weights(Path(SCALE_DIR))):
        pytest.fail(why)
    res = scale_command("agreement", SCALE_DIR, RECIPE, cache=cache)
    record("agreement", res)
    assert res["prompt_tokens"] > res["sliding_window"] and res["finite"]
    assert res["problem"] is None, res["problem"]
    if synthetic:
        limit = tolerance("scale/pte_vs_eager_over_nudge").atol
        assert res["pte_over_nudge"] <= limit, (
            f".pte vs eager {res['max_abs_logit_diff'][0]:.3f} is {res['pte_over_nudge']:.2f}x what a 1e-6 nudge "
            f"moves eager ({res['eager_nudged_max_abs_logit_diff']:.3f}) > {limit}")


def test_native_runner_side_by_side_with_llamacpp_q4_0(stages, cache):
    from harness.cache import ArtifactCache
    from harness.runtimes.gguf import gguf_for

    pte = stages["stages"]["lower+serialize"]["artifact"]
    gguf = gguf_for(SCALE_DIR, "q4_0", cache=ArtifactCache(cache), progress=print, source="bf16")
    res = scale_command("speed", pte, str(gguf), SCALE_DIR, cache=cache)
    record("speed", res)
    report = json.loads(OUT.read_text())
    if "agreement" in report:  # the .pte's bytes per decode token come from the quantized model
        from harness.bench.scale import projection

        record("projection", projection(res, report["agreement"]["bytes_per_token"]))
    print(json.dumps(res, indent=1))
    assert res["native"]["decode_tok_s"] > 0 and res["llama.cpp"]["decode_tok_s"] > 0
