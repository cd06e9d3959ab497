"""The benchmark tools themselves (no model needed): Pi 5 readers, energy integration, the
roofline's byte counts, the report. Runs in the mac tier so they cannot rot between Pi runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.runtimes.base import RuntimeSpec

from harness.bench import device
from harness.errors import HarnessError

pytestmark = pytest.mark.mac

PMIC_SAMPLE = """\
     3V7_WL_SW_A current(0)=0.00390372A
       3V3_SYS_A current(1)=0.05660400A
     VDD_CORE_A current(7)=2.00000000A
     3V7_WL_SW_V volt(8)=3.70000000V
       3V3_SYS_V volt(9)=3.30000000V
     VDD_CORE_V volt(15)=0.90000000V
       EXT5V_V volt(24)=5.12000000V
"""


def test_pmic_power_is_the_sum_of_current_times_voltage_over_paired_rails():
    want = 0.00390372 * 3.7 + 0.056604 * 3.3 + 2.0 * 0.9  # EXT5V has no current: not a rail
    assert device.parse_pmic_adc(PMIC_SAMPLE) == pytest.approx(want)
    assert device.parse_pmic_adc("") is None


@pytest.mark.parametrize("text,mask,words", [
    ("throttled=0x0", 0, "never throttled"),
    ("throttled=0x50005", 0x50005, "under-voltage now"),
    ("no such command", None, "unknown"),
])
def test_throttled_state_is_decoded(text, mask, words):
    assert device.parse_throttled(text) == mask
    assert words in device.describe_throttled(mask)


def test_board_detection_reads_the_device_tree(tmp_path):
    model = tmp_path / "model"
    model.write_bytes(b"Raspberry Pi 5 Model B Rev 1.0\0")
    assert device.is_pi5(model) and device.board_model(model) == "Raspberry Pi 5 Model B Rev 1.0"
    model.write_bytes(b"Raspberry Pi 4 Model B Rev 1.4\0")
    assert not device.is_pi5(model)
    assert not device.is_pi5(tmp_path / "absent")


def test_energy_integrates_power_over_time():
    s = device.PowerSampler(read=lambda: 5.0)
    s.samples = [(0.0, 4.0), (1.0, 6.0), (3.0, 6.0)]
    assert s.joules == pytest.approx(5.0 + 12.0)
    assert s.mean_watts == pytest.approx(17.0 / 3.0)


def test_external_meter_command_is_read_as_watts():
    assert device.meter_watts("echo 4.25 W") == 4.25
    assert device.meter_watts("echo nonsense") is None


def test_decode_bytes_count_linears_in_full_and_one_embedding_row(pipeline):
    """The fixture's FP32 decode step reads every linear (the tied output projection included),
    one row of each embedding table and the KV cache; 8da4w reads about 4.5 bits per weight."""
    from harness.bench.roofline import kv_bytes_per_token, torch_bytes_per_token

    fp32, q = pipeline("fp32"), pipeline("8da4w")
    cfg = fp32.loaded.config
    linears = sum(m.weight.numel() for m in fp32.loaded.model.modules() if isinstance(m, __import__("torch").nn.Linear))
    rows = cfg.hidden_size + cfg.num_hidden_layers * cfg.hidden_size_per_layer_input
    assert torch_bytes_per_token(fp32.loaded.model, 40) == 4 * (linears + rows) + kv_bytes_per_token(cfg, 40)
    ratio = (torch_bytes_per_token(q.quantized, 40) - kv_bytes_per_token(cfg, 40)) / (4 * linears)
    # INT4 codes packed (1/8 of FP32) + one FP32 scale per group of 32 (1/32): 0.156 of FP32,
    # plus the INT8 per-layer embedding row
    assert 0.15 < ratio < 0.17, ratio


def test_kv_bytes_follow_the_window_and_skip_shared_layers(pipeline):
    from harness.bench.roofline import kv_bytes_per_token

    cfg = pipeline("fp32").loaded.config  # 4 cache-owning layers: 3 sliding (32), 1 full (64)
    assert kv_bytes_per_token(cfg, 10) == 2 * 4 * 10 * (3 * 32 + 64)
    assert kv_bytes_per_token(cfg, 100) == 2 * 4 * (3 * 32 * 16 + 64 * 100)


def _result(tmp_path, failures=None):
    def bench(runtime, kind, recipe, decode, counterpart=""):
        return {"name": f"test_host_benchmark[{runtime}]", "extra_info": {
            "runtime": runtime, "kind": kind, "recipe": recipe, "model": "bench", "threads": 2,
            "prefill_tok_s": 10 * decode, "decode_tok_s": decode, "ttft_s": 0.05, "load_s": 1.0,
            "peak_rss_mb": 900.0, "model_rss_mb": 300.0, "roofline_fraction": 0.5, "counterpart": counterpart,
            "prompts": 5, "rounds": 3, "prompt_tokens": 32, "new_tokens": 64}}

    data = {"machine_info": {"node": "host", "cpu": {"brand_raw": "CPU"}},
            "benchmarks": [bench("executorch:8da4w", "executorch", "8da4w", 100.0, "llama.cpp:q4_0"),
                           bench("llama.cpp:q4_0", "llama.cpp", "q4_0", 200.0)],
            "harness": {"bandwidth": {"threads": 2, "read_gb_s": 20.0, "buffer_mb": 512},
                        "failures": failures or {}, "libraries": {"torch": "2.13.0"}}}
    path = tmp_path / "out.json"
    path.write_text(json.dumps(data))
    return path


def test_report_table_has_a_row_per_runtime_and_the_llama_cpp_ratio(tmp_path):
    from harness.bench.report import markdown, read_result

    text = markdown(read_result(_result(tmp_path, {"llama.cpp:f32": "ValueError: no converter"})))
    lines = text.splitlines()
    assert lines[0].startswith("| model") and "vs llama.cpp" in lines[0]
    row = next(line for line in lines if "| executorch" in line)
    assert "100.0" in row and "0.50×" in row and "50%" in row
    assert "llama.cpp:f32 did not run:** ValueError: no converter" in text


def test_report_command_writes_the_table_and_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = _result(tmp_path)
    out = subprocess.run([sys.executable, "-m", "harness", "bench", "report", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| bench" in out.stdout
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content,words", [
    (None, "does not exist"),
    ("{not json", "is not valid JSON"),
    ('{"a": 1}', "not a pytest-benchmark result"),
    ('{"benchmarks": []}', "no harness benchmark figures"),
])
def test_report_refuses_what_is_not_a_benchmark_result(tmp_path, content, words):
    from harness.bench.report import read_result

    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(HarnessError, match=words):
        read_result(path)


# ---- each runtime timed in a process of its own ---------------------------------------------------
# Regression: timed in the pytest process, after the 8da4w-fast .pte had run there, llama.cpp Q4_0
# decoded at 60-80 tok/s instead of 255-310 (the same GGUF, 2 threads, an idle machine): one
# runtime's leftovers in the process slowed the next one, and the side-by-side table lied.
def test_each_runtime_is_timed_in_a_fresh_process_with_the_same_answers():
    import os

    from harness.runtimes.base import open_runtime
    from harness.runtimes.process import isolated

    prompt = [2, 40, 41, 42, 43, 44]
    with isolated("eager", "fixture", 1) as child:
        assert child.pid != os.getpid()
        first = child.generate(prompt, 5)
        again = child.generate(prompt, 5)
        assert child.load_s > 0
    assert child.returncode == 0  # closed cleanly when the block ended
    here = open_runtime("eager", "fixture", threads=1).generate(prompt, 5)
    assert first.ids == again.ids == here.ids
    assert (first.prompt_tokens, first.new_tokens) == (6, 5) and first.ttft_s > 0 and first.decode_s > 0


def test_a_runtime_that_fails_in_its_process_says_why_in_one_line(tmp_path):
    from harness.runtimes.process import isolated

    missing = tmp_path / "missing.pte"
    with pytest.raises(HarnessError) as err:
        isolated("executorch", str(missing), 1)
    message = str(err.value)
    assert "\n" not in message and "executorch on" in message and "missing.pte" in message


def test_the_cpp_runner_figures_come_from_a_process_of_their_own(pipeline):
    from harness.bench.suite import runner_figures

    pipe = pipeline("fp32")
    figures = runner_figures(str(pipe.pte_path), str(pipe.loaded.directory / "tokenizer.json"),
                             ["The capital of France is"], new_tokens=4, rounds=1)
    assert figures["runner_decode_tok_s"] > 0 and figures["runner_prefill_tok_s"] > 0
    assert figures["runner_ttft_s"] > 0 and figures["runner_load_s"] > 0
    with pytest.raises(HarnessError, match="LLM runner"):
        runner_figures(str(pipe.pte_path) + ".missing", str(pipe.loaded.directory / "tokenizer.json"), ["x"], 2, 1)


def test_bandwidth_is_the_best_of_its_read_loops():
    """Regression: numpy's pairwise float64 sum alone read 17 GB/s here while llama.cpp F32 decode
    moved 27 GB/s, so the roofline read 156%: the figure must be the best loop's, named."""
    from harness.bench.roofline import read_bandwidth

    bw = read_bandwidth(threads=1, buffer_mb=64, repeats=2)
    assert bw.read_gb_s > 0.5 and bw.threads == 1 and bw.buffer_mb == 64
    assert bw.kernel in ("numpy sum, one slice per thread", "torch sum")


# ---- paired rounds: each runtime against its llama.cpp counterpart in the same minutes -----------
# Regression: on this shared VM llama.cpp Q4_0 measured 408.8 decode tok/s in one run and 196.3 in
# the next (same GGUF, idle guest, host steal time); a ratio between rows timed minutes apart moved
# from 1.05x to 2.35x. Rounds of the runtime and of its counterpart now alternate.
class _FakeBenchmark:
    def __init__(self):
        self.extra_info = {}

    def pedantic(self, target, setup=None, rounds=1, iterations=1, warmup_rounds=0):
        for _ in range(rounds):
            if setup:
                setup()
            target()


class _FakeRunner:
    def __init__(self, name, log, decode_s):
        self.name, self.log, self.decode_s = name, log, decode_s

    def generate(self, ids, n):
        from harness.runtimes.base import Generation

        self.log.append(self.name)
        return Generation(prompt_ids=list(ids), ids=list(range(n)), ttft_s=0.01, decode_s=self.decode_s)


def test_rounds_alternate_with_the_counterpart_and_the_ratio_is_paired():
    from harness.bench.suite import Protocol, run_benchmark

    log: list[str] = []
    bench = _FakeBenchmark()
    protocol = Protocol(prompts=[[2, 3], [2, 4]], new_tokens=5, rounds=3, threads=1)
    passes = run_benchmark(bench, _FakeRunner("pte", log, 0.01), protocol,
                           paired=("llama.cpp:q4_0", _FakeRunner("gguf", log, 0.02)))
    assert len(passes) == 3
    # warm-up of both, then each round: the counterpart's pass, then the runtime's (two prompts each)
    assert log == ["pte"] * 2 + ["gguf"] * 2 + (["gguf"] * 2 + ["pte"] * 2) * 3
    info = bench.extra_info
    assert info["paired_runtime"] == "llama.cpp:q4_0"
    assert info["paired_decode_tok_s"] == pytest.approx(200.0) and info["decode_tok_s"] == pytest.approx(400.0)
    assert info["paired_ratio_decode"] == pytest.approx(2.0)
    assert info["paired_ratio_prefill"] == pytest.approx(1.0)


def test_the_report_prefers_the_paired_ratio():
    from harness.bench.report import rows

    def bench(runtime, decode, **extra):
        kind, recipe = RuntimeSpec.parse(runtime)
        return {"name": runtime, "extra_info": dict(runtime=runtime, kind=kind, recipe=recipe, model="bench",
                                                    decode_tok_s=decode, counterpart="llama.cpp:q4_0" if kind != "llama.cpp" else "", **extra)}

    data = {"benchmarks": [bench("executorch:8da4w-fast", 450.0, paired_ratio_decode=1.3),
                           bench("executorch:8da4w", 150.0), bench("llama.cpp:q4_0", 200.0)]}
    ratios = {r["runtime"]: r["ratio"] for r in rows(data)}
    assert ratios["executorch:8da4w-fast"] == 1.3  # paired, not 450 / 200
    assert ratios["executorch:8da4w"] == pytest.approx(0.75)  # unpaired: row over row


# ---- the host in every figure (harness/bench/host.py) ---------------------------------------------
ZEN3_CPUINFO = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 1
model name	: AMD EPYC 7B13
stepping	: 0
flags		: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2

processor	: 1
flags		: avx512f
"""
PI5_CPUINFO = """processor	: 0
BogoMIPS	: 108.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x4
CPU part	: 0xd0b
CPU revision	: 1
"""


def test_host_names_the_cpu_and_the_isa_its_kernels_can_use():
    from harness.bench.host import parse_cpuinfo

    zen3 = parse_cpuinfo(ZEN3_CPUINFO)
    assert (zen3["model"], zen3["family"], zen3["model_number"], zen3["stepping"]) == ("AMD EPYC 7B13", 25, 1, 0)
    assert zen3["isa"] == ["avx2", "f16c", "fma"]  # the second processor's avx512f is not the first's
    pi5 = parse_cpuinfo(PI5_CPUINFO)
    assert pi5["model"] == "Cortex-A76" and pi5["stepping"] == 1
    assert pi5["isa"] == ["dotprod", "fp16", "neon", "rdm"]  # no i8mm, SVE or SME: the Pi 5's A76
    assert parse_cpuinfo("")["model"] is None


def test_host_reads_the_caches_and_says_them_in_one_line(tmp_path):
    from harness.bench.host import caches, describe

    for i, (level, kind, size, shared) in enumerate([(1, "Data", "32K", "0"), (1, "Instruction", "32K", "0"),
                                                      (2, "Unified", "512K", "0"), (3, "Unified", "32768K", "0-7")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")
    found = caches(tmp_path)
    assert [c["bytes"] for c in found] == [32 << 10, 32 << 10, 512 << 10, 32 << 20]
    line = describe({"model": "AMD EPYC 7B13", "family": 25, "model_number": 1, "stepping": 0, "isa": ["avx2"],
                     "caches": found, "threads": 2, "affinity": [0, 1, 2, 5]})
    assert line == ("AMD EPYC 7B13 (family 25 model 1 stepping 0); ISA: avx2; L1 32 KiB, L2 512 KiB, "
                    "L3 32 MiB (shared 0-7); 2 threads on CPUs 0-2,5")


def test_the_report_names_the_host_that_measured_it():
    from harness.bench.host import host_info
    from harness.bench.report import markdown

    data = {"benchmarks": [{"name": "x", "extra_info": {"runtime": "executorch-native:8da4w-fast", "kind": "executorch-native",
                                                         "model": "bench", "recipe": "8da4w-fast", "decode_tok_s": 100.0,
                                                         "prefill_tok_s": 900.0, "ttft_s": 0.02, "prompts": 5, "rounds": 3,
                                                         "prompt_tokens": 32, "new_tokens": 64}}],
            "harness": {"host": host_info(2)}}
    text = markdown(data)
    assert "ISA:" in text and "threads on CPUs" in text


def test_the_lowering_comparison_times_both_ways_and_tells_differing_programs_apart():
    """``python -m harness.bench.lowering``: rounds alternate plain and lean, each on a fresh reload,
    and ``same_bytes`` turns False the moment the two programs differ (the regression the README's
    ratio must never hide). A stand-in lowering keeps this to the export's seconds."""
    from types import SimpleNamespace

    from harness.bench.lowering import compare

    calls = []

    def fake_lower(box, recipe, metadata, lean):
        calls.append((lean, box.pop() is not None))
        return SimpleNamespace(buffer=b"program"), None

    res = compare("fixture", "fp32", rounds=2, lower=fake_lower)
    assert calls == [(False, True), (True, True)] * 2
    assert res["same_bytes"] and len(res["plain_seconds"]) == len(res["lean_seconds"]) == 2
    assert res["plain_over_lean"] > 0

    def differing(box, recipe, metadata, lean):
        return SimpleNamespace(buffer=b"lean" if lean else b"plain"), None

    assert compare("fixture", "fp32", rounds=1, lower=differing)["same_bytes"] is False
