"""Speed across an upgrade (``harness bench diff``, harness/bench/perf.py): the bench tier's paired
ratios against llama.cpp, compared within one host class, a drop beyond the spread between runs
flagged. The synthetic runs here check the rules; ``docs/perf/`` holds real runs of this host (five
of one stack, one with the kernel path forced to portable), and the last test holds the command to
what they showed (docs/upgrade-day.md, 'Speed across an upgrade')."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench.perf import bench_diff, class_key, median_side, read_side, record, spread
from harness.errors import HarnessError
from harness.tolerances import tolerance

pytestmark = pytest.mark.mac
ROOT = Path(__file__).resolve().parent.parent
HOST = {"machine": "x86_64", "isa": ["avx2", "avx512f"], "threads": 2, "model": "Some CPU"}


def _run(path: Path, ratios: dict, host=HOST) -> Path:
    benches = [{"name": f"test_host_benchmark[{rt}]", "extra_info": {
        "runtime": rt, "decode_tok_s": 100.0 * d, "paired_ratio_decode": d, "paired_ratio_prefill": p}}
        for rt, (d, p) in ratios.items()]
    benches.append({"name": "test_host_benchmark[llama.cpp:q4_0]", "extra_info": {"runtime": "llama.cpp:q4_0",
                                                                               "decode_tok_s": 100.0}})
    path.write_text(json.dumps({"benchmarks": benches, "harness": {"host": host}}))
    return path


def _lines():
    out: list[str] = []
    return out, out.append


def test_quiet_within_the_spread_and_flags_a_drop_beyond_it(tmp_path):
    bar = tolerance("bench/paired_drop/decode").atol
    old = read_side(_run(tmp_path / "old.json", {"executorch-native:8da4w-fast": (1.50, 1.20)}))
    within = read_side(_run(tmp_path / "same.json", {"executorch-native:8da4w-fast": (1.50 * (1 - bar / 2), 1.20)}))
    out, say = _lines()
    assert bench_diff(old, within, say) == 0, out
    slower = read_side(_run(tmp_path / "slow.json", {"executorch-native:8da4w-fast": (1.50 * (1 - 2 * bar), 1.20)}))
    out, say = _lines()
    assert bench_diff(old, slower, say) == 1
    assert any("executorch-native:8da4w-fast" in l and "decode" in l and "DROP" in l for l in out), out
    faster = read_side(_run(tmp_path / "fast.json", {"executorch-native:8da4w-fast": (3.0, 2.4)}))
    assert bench_diff(old, faster, say) == 0, "a rise is not a regression"


def test_prefill_drops_are_flagged_too_and_a_runtime_that_stopped_running_is(tmp_path):
    bar = tolerance("bench/paired_drop/prefill").atol
    old = read_side(_run(tmp_path / "old.json", {"a:x": (1.0, 1.0), "b:y": (1.0, 1.0)}))
    new = read_side(_run(tmp_path / "new.json", {"a:x": (1.0, 1.0 - 2 * bar)}))
    out, say = _lines()
    assert bench_diff(old, new, say) == 1
    assert any("a:x" in l and "prefill" in l and "DROP" in l for l in out)
    assert any("b:y" in l and "did not run" in l for l in out), out


def test_another_host_class_is_not_compared(tmp_path):
    old = read_side(_run(tmp_path / "old.json", {"a:x": (1.0, 1.0)}))
    other = read_side(_run(tmp_path / "new.json", {"a:x": (1.0, 1.0)}, {**HOST, "isa": ["avx2"]}))
    with pytest.raises(HarnessError, match="host class"):
        bench_diff(old, other)
    assert class_key(old["host_class"]) == "x86_64-avx2+avx512f-2t"


def test_bad_inputs_say_what_to_pass(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(HarnessError, match="not a readable JSON"):
        read_side(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"benchmarks": [], "harness": {"host": HOST}}))
    with pytest.raises(HarnessError, match="no paired ratio"):
        read_side(tmp_path / "y.json")


def test_the_golden_is_the_median_and_recording_a_slower_one_is_gated(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_GOLDENS_DIR", str(tmp_path / "goldens"))
    runs = [_run(tmp_path / f"r{i}.json", {"a:x": (r, 1.0)}) for i, r in enumerate((1.0, 1.1, 0.9, 1.05, 0.95))]
    sides = [read_side(p) for p in runs]
    assert median_side(sides)["ratios"]["a:x"]["decode"] == 1.0
    assert abs(spread(sides)["decode"] - 0.1) < 1e-9
    out, say = _lines()
    assert record(runs, say=say) == 0
    golden = tmp_path / "goldens" / "perf" / "x86_64-avx2+avx512f-2t.json"
    before = golden.read_bytes()
    slow = [_run(tmp_path / "s.json", {"a:x": (0.5, 1.0)})]
    assert record(slow, say=say) == 1 and golden.read_bytes() == before, "a slower golden was written"
    assert record(slow, allow="accepted: XNNPACK 1.6 dropped the AVX-512 kernels", say=say) == 0
    assert json.loads(golden.read_text())["allowed"][0]["reason"].startswith("accepted")


def test_the_command_on_real_runs_flags_the_portable_kernel_and_is_quiet_between_reruns(tmp_path, monkeypatch):
    """docs/perf/: five bench runs of one stack on one host, and one with HARNESS_Q4_PATH=portable."""
    from itertools import permutations

    from support import run_cli

    runs = sorted((ROOT / "docs" / "perf").glob("run-*.json"))
    assert len(runs) >= 5, "the spread needs at least 5 runs"
    for a, b in permutations(runs, 2):
        out, say = _lines()
        assert bench_diff(read_side(a), read_side(b), say) == 0, f"{a.name} -> {b.name}: a false alarm\n" + "\n".join(out)
    portable = ROOT / "docs" / "perf" / "portable-q4.json"
    rc, out, err = run_cli(["bench", "diff", str(runs[0]), str(portable)])
    assert rc == 1 and "executorch-native:8da4w-fast" in out and "DROP" in out, out + err
    # against the performance golden of the five runs (their median), on the command line too
    monkeypatch.setenv("HARNESS_GOLDENS_DIR", str(tmp_path / "goldens"))
    assert run_cli(["bench", "record", *map(str, runs)])[0] == 0
    rc, out, err = run_cli(["bench", "diff", str(portable)])
    assert rc == 1 and "prefill" in out and "DROP" in out, out + err
    assert run_cli(["bench", "diff", str(runs[2])])[0] == 0
