"""Memory pre-flight: the parameter count without loading, the estimate against measured peak RSS
(a fresh process, an empty artifact cache), the refusal and its override."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.export import preflight
from harness.errors import HarnessError
from harness.export.preflight import (
    ModelSize, check, checked_pipeline, estimate, measure_in_subprocess, model_size, size_from_loaded,
)

from harness.tolerances import observe, tolerance  # noqa: E402


def _within(est: int, measured: int) -> float:
    return abs(est - measured) / measured


# ---- counting ----------------------------------------------------------------------------------
@pytest.mark.mac
def test_headers_count_what_the_loaded_fixture_holds(pipeline):
    from_headers = model_size("fixture")
    loaded = size_from_loaded(pipeline("fp32").loaded)
    # the headers also hold the 6 per-layer scalars the model keeps as buffers
    assert 0 <= from_headers.params - loaded.params <= 16, (from_headers, loaded)
    assert (from_headers.linear, from_headers.per_layer_embedding) == (loaded.linear, loaded.per_layer_embedding)
    assert from_headers.source == "safetensors headers"


@pytest.mark.mac
def test_a_config_is_counted_on_the_meta_device(tmp_path):
    from harness.models.load import FIXTURE_DIR

    cfg = tmp_path / "fixture-config.json"
    cfg.write_text((FIXTURE_DIR / "config.json").read_text())
    from_config = model_size(str(cfg))
    assert from_config.params == 1_495_360 and from_config.source == "config on the meta device"


@pytest.mark.mac
@pytest.mark.parametrize("damage, expected", [
    (lambda b: b[:5], "shorter than its header"),
    (lambda b: b[:8] + b"{not json" + b[17:], "damaged safetensors header"),
    (lambda b: b[: len(b) // 2], "is truncated: its header describes"),
    (lambda b: (10 ** 12).to_bytes(8, "little") + b[8:], "is not a safetensors file"),
], ids=["tiny", "header-not-json", "cut-in-half", "absurd-header-length"])
def test_a_damaged_checkpoint_is_named_before_loading(tmp_path, damage, expected):
    from harness.models.load import FIXTURE_DIR

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((FIXTURE_DIR / name).read_bytes())
    (tmp_path / "model.safetensors").write_bytes(damage((FIXTURE_DIR / "model.safetensors").read_bytes()))
    with pytest.raises(HarnessError, match=expected) as e:
        model_size(str(tmp_path))
    assert "\n" not in str(e.value)


# ---- the check -----------------------------------------------------------------------------------
SIZE = ModelSize("toy", 5_000_000_000, 2_000_000_000, 2_000_000_000, "test")


@pytest.mark.mac
def test_refuses_with_one_line_naming_the_override(monkeypatch):
    monkeypatch.delenv(preflight.SKIP_ENV, raising=False)
    with pytest.raises(HarnessError) as e:
        check(SIZE, "8da4w", "lower", available=8 << 30, rss=0)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("not enough memory: toy (5,000.0M parameters, 8da4w) needs about")
    assert "8.0 GiB is available" in msg and "--skip-memory-check" in msg and "HARNESS_SKIP_MEMORY_CHECK=1" in msg


@pytest.mark.mac
def test_memory_this_process_already_holds_counts(monkeypatch):
    monkeypatch.delenv(preflight.SKIP_ENV, raising=False)
    est = estimate(SIZE, "fp32", "load").peak_bytes
    check(SIZE, "fp32", "load", available=est // 2, rss=est // 2 + 1)  # the model is half loaded already
    with pytest.raises(HarnessError):
        check(SIZE, "fp32", "load", available=est // 2, rss=0)


@pytest.mark.mac
def test_the_override(monkeypatch):
    check(SIZE, "fp32", "lower", available=1, rss=0, skip=True)
    monkeypatch.setenv(preflight.SKIP_ENV, "1")
    check(SIZE, "fp32", "lower", available=1, rss=0)


@pytest.mark.mac
def test_estimates_grow_with_the_stage_and_the_model():
    small, big = model_size("fixture"), ModelSize("big", 10 ** 9, 8 * 10 ** 8, 10 ** 8, "test")
    for recipe in ("fp32", "8da4w"):
        peaks = [estimate(big, recipe, s).peak_bytes for s in preflight.STAGES]
        assert peaks == sorted(peaks)
        assert estimate(small, recipe).peak_bytes < estimate(big, recipe).peak_bytes


# ---- the pipeline hook -----------------------------------------------------------------------------
@pytest.mark.mac
def test_the_pipeline_checks_before_loading_and_loads_nothing_when_refused(monkeypatch, tmp_path):
    import harness.export.pipeline

    monkeypatch.delenv(preflight.SKIP_ENV, raising=False)
    monkeypatch.setattr(preflight, "available_memory", lambda: 1 << 20)
    monkeypatch.setattr(preflight, "current_rss", lambda: 0)  # as a fresh `harness export` process
    monkeypatch.setattr(harness.export.pipeline, "shared_model", lambda spec: pytest.fail("loaded despite refusal"))
    pipe = checked_pipeline("fixture", "fp32")
    with pytest.raises(HarnessError, match="not enough memory: fixture .* through lower"):
        pipe.pte_path


@pytest.mark.mac
def test_the_pipeline_checks_each_stage_it_builds(monkeypatch, tmp_path):
    """An empty cache: load (for everything up to lower), then export is about to be built."""
    from harness.cache import ArtifactCache

    stages: list[str] = []

    def fake_check(size, recipe, stage="lower", **kw):
        stages.append(stage)
        if stage == "export":
            raise HarnessError("stop", "here")  # before anything is built

    monkeypatch.setattr(preflight, "check", fake_check)
    monkeypatch.delenv(preflight.SKIP_ENV, raising=False)
    pipe = checked_pipeline("fixture", "8da4w")
    pipe.cache = ArtifactCache(tmp_path)
    with pytest.raises(HarnessError, match="stop"):
        pipe.pte_path
    # before loading (for everything up to lower), before lowering, before exporting: the lowering
    # needs the .pt2 first; quantizing happens inside the export build, after its check
    assert stages == ["lower", "lower", "export"], stages
    # nothing built: the only thing left is the entry's lock, which the builder held (harness/cache.py)
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert [p for p in left if not p.startswith(".locks")] == [], left
    assert all(p.endswith(".lock") for p in left if p != ".locks"), left


@pytest.mark.mac
def test_a_cached_pte_skips_the_export_and_lower_checks(pipeline, monkeypatch):
    pipeline("fp32").pte_path  # in the cache now
    stages: list[str] = []
    monkeypatch.setattr(preflight, "check", lambda size, recipe, stage="lower", **kw: stages.append(stage))
    monkeypatch.delenv(preflight.SKIP_ENV, raising=False)
    checked_pipeline("fixture", "fp32").pte_path
    assert stages == ["lower"]  # only the pre-load check


# ---- the command line --------------------------------------------------------------------------------
def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})


@pytest.mark.mac
def test_export_of_a_model_too_big_for_this_machine_is_refused_before_loading(tmp_path):
    cfg = json.loads((preflight.Path(__file__).resolve().parent.parent / "harness/models/configs/bench.json").read_text())
    cfg.update(hidden_size=16384, intermediate_size=65536, vocab_size=262144, vocab_size_per_layer_input=262144)
    (tmp_path / "huge.json").write_text(json.dumps(cfg))
    res = _cli("export", "--model", str(tmp_path / "huge.json"), "--recipe", "8da4w", "--out", str(tmp_path / "m.pte"),
               env={preflight.SKIP_ENV: ""})
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("harness: error: not enough memory: huge ("), res.stderr
    assert "--skip-memory-check" in res.stderr
    assert not (tmp_path / "m.pte").exists()


@pytest.mark.mac
def test_doctor_shows_the_estimate_against_memory_and_disk():
    from support import run_cli

    rc, out, err = run_cli(["doctor", "--model", "fixture", "--recipe", "fp32"])
    assert rc == 0 and err == "", err
    assert "export of fixture (1.5M parameters, fp32): about" in out and "at its peak" in out
    assert "its .pt2 and .pte, and the copy at --out: about" in out


# ---- the estimate against measured peak RSS ------------------------------------------------------------
@pytest.mark.mac
@pytest.mark.parametrize("recipe, until", [("fp32", "lower"), ("8da4w", "export")])
def test_estimate_within_25_percent_of_measured_for_the_fixture(recipe, until):
    """A fresh process, an empty artifact cache (the stages really run), ``ru_maxrss`` after them.
    8da4w stops after export here (its lowering takes minutes; the bench tier runs it whole)."""
    measured = measure_in_subprocess("fixture", recipe, until)
    size = model_size("fixture")
    for stage in ("export", until):
        est = estimate(size, recipe, stage).peak_bytes
        off = _within(est, measured[stage])
        observe("preflight/fixture", off)
        assert off <= tolerance("preflight/fixture").atol, (
            f"fixture {recipe} through {stage}: estimate {est / 2**20:.0f} MiB, measured "
            f"{measured[stage] / 2**20:.0f} MiB")


@pytest.mark.bench
@pytest.mark.parametrize("model, recipe", [("fixture", "8da4w"), ("bench", "fp32"), ("bench", "8da4w")])
def test_estimate_within_25_percent_of_measured_through_lowering(model, recipe):
    """The whole export (load, quantize, export, lower) of the fixture's 8da4w and the benchmark
    model (70.5M parameters), each in a fresh process with an empty cache: minutes each."""
    spec = model
    if model == "bench":
        from harness.models.bench import bench_model_dir

        spec = str(bench_model_dir())  # built once in the real cache; the measured process only loads it
    measured = measure_in_subprocess(spec, recipe, "lower")
    est = estimate(model_size(model), recipe, "lower").peak_bytes
    print(f"{model} {recipe}: estimate {est / 2**20:.0f} MiB, measured {measured['lower'] / 2**20:.0f} MiB")
    off = _within(est, measured["lower"])
    observe("preflight/bench", off)
    assert off <= tolerance("preflight/bench").atol, (est, measured)
