"""The tied token table stored once (harness/export/fast/tied.py): one INT4 copy for the lookup
(ExecuTorch's ``embedding_4bit``) and for ``lm_head`` (``harness::q4_linear``, our own kernel:
harness/runtimes/cpp/tied_kernels.cpp). Its eager definition must be torchao's 8da4w ``lm_head``
bit for bit, and the kernel must compute it on every path this CPU has."""

from __future__ import annotations

import os

import pytest
import torch

from harness.bench.tied import Head, load_program, quantized_head
from harness.export.fast.tied import pack, row_sums
from harness.oplib import define_harness_ops, dequantize, unpack
from harness.tolerances import observe, tolerance

pytestmark = pytest.mark.mac

define_harness_ops()


def test_pack_is_embedding_4bit_layout():
    """ExecuTorch's own embedding_4bit reads the packed table as the quantized weights."""
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401

    _, q, s = quantized_head(64, 37, 32)
    packed = pack(q)
    assert packed.dtype == torch.uint8 and packed.shape == (37, 32)
    assert torch.equal(unpack(packed), q)
    ids = torch.tensor([[0, 5, 36, 5]])
    rows = torch.ops.quantized_decomposed.embedding_4bit.dtype(packed, s, None, -8, 7, ids, dtype=torch.float32)
    assert torch.equal(rows, dequantize(packed, s)[ids])
    assert torch.equal(dequantize(packed, s), (q.float().reshape(37, 2, 32) * s.unsqueeze(-1)).reshape(37, 64))


def test_q4_linear_eager_is_torchao_8da4w_bit_for_bit():
    m, q, s = quantized_head(256, 97, 128)
    x = torch.randn(1, 5, 256) * 3
    packed = pack(q)
    assert torch.equal(torch.ops.harness.q4_linear(x, packed, s, row_sums(packed, s)), m(x))
    capped = torch.ops.harness.q4_linear(x, packed, s, row_sums(packed, s), 30.0)
    assert torch.equal(capped, torch.tanh(m(x) / 30.0) * 30.0)  # Gemma's softcapping, as the model does it


def lower(head: Head):
    return load_program(head, head.packed.shape[1] * 2)


def program(d: int, v: int, group: int, seed: int = 0, softcap: float = 0.0):
    _, q, s = quantized_head(d, v, group, seed)
    head = Head(pack(q), s, softcap)
    return lower(head), head


def kernel_problem(got, want, what: str, record: bool = True) -> str | None:
    """The kernel against the eager definition: the same INT8 codes and INT4 weights, so only FP32
    rounding may differ. ``record``: False for a deliberately broken kernel (not a measurement)."""
    diff = float((got - want).abs().max())
    if record:
        observe("q4_linear/kernel_vs_eager", diff)
    if diff > tolerance("q4_linear/kernel_vs_eager").atol:
        return f"{what}: max |diff| {diff:.3g}"
    return None
def cpu_paths() -> list[str]:
    """The kernel paths this CPU can run, from the ISA features harness.bench.host reads."""
    from harness.bench.host import CPUINFO, parse_cpuinfo

    isa = set(parse_cpuinfo(CPUINFO.read_text() if CPUINFO.exists() else "")["isa"])
    paths = ["portable"]
    if {"avx2", "fma"} <= isa:
        paths.append("avx2")
    if {"avx512_vnni", "avx512bw"} <= isa:
        paths.append("avx512vnni")
    if "neon" in isa:
        paths.append("neon")
    return paths


def run_path(module, x, path: str):
    old = os.environ.get("HARNESS_Q4_PATH")
    os.environ["HARNESS_Q4_PATH"] = path
    try:
        return module.forward([x])[0]
    finally:
        if old is None:
            del os.environ["HARNESS_Q4_PATH"]
        else:
            os.environ["HARNESS_Q4_PATH"] = old


# (D, V, G, softcap): E2B's group and Gemma's softcap, AVX2's group, the fixture's
SHAPES = [(256, 97, 128, 30.0), (256, 97, 128, 0.0), (256, 61, 64, 0.0), (128, 33, 32, 30.0)]


@pytest.mark.parametrize("d,v,group,softcap", SHAPES)
def test_kernel_equals_eager_on_every_path_of_this_cpu(d, v, group, softcap):
    """Every path this CPU can run (HARNESS_Q4_PATH forces one; a SIMD path that the group size does
    not allow is not run), prefill and decode shapes, against the eager definition."""
    module, head = program(d, v, group, softcap=softcap)
    ran = []
    for path in cpu_paths():
        if (path == "avx512vnni" and group % 128) or (path == "avx2" and group % 64):
            continue
        for m, seed in ((1, 1), (4, 2), (7, 3), (13, 4)):
            torch.manual_seed(seed)
            x = torch.randn(1, m, d) * (1 + seed)
            x[0, 0, 0] = 40.0  # a token whose range is far from symmetric (zero point far from 0)
            problem = kernel_problem(run_path(module, x, path), head(x), f"{path}, {m} tokens")
            assert problem is None, problem
        ran.append(path)
    assert "portable" in ran


def test_the_comparison_fails_for_a_kernel_that_drops_the_zero_point():
    """The regression the check above names: the activations' zero-point term dropped, which is
    what the kernel computes with row_sums zeroed. The comparison must fail."""
    module, head = program(256, 97, 128)
    x = torch.randn(1, 3, 256) + 2.0  # all positive: a zero point of -128
    want = head(x)
    assert kernel_problem(run_path(module, x, "portable"), want, "correct") is None
    with torch.no_grad():
        head.row_sums.zero_()
    assert kernel_problem(run_path(lower(head), x, "portable"), want, "zero point dropped", record=False) is not None


def test_a_forced_path_this_cpu_lacks_fails_the_call():
    module, _ = program(128, 33, 32)
    with pytest.raises(RuntimeError):
        run_path(module, torch.randn(1, 2, 128), "avx512vnni")  # group 32: not available


def test_the_lm_head_comparison_command_runs_on_a_small_shape(capsys):
    """``python -m harness.bench.tied``: both sides timed on the same input, each against eager."""
    from harness.bench.tied import _main

    assert _main(["97", "256", "128", "1"]) == 0
    import json

    res = json.loads(capsys.readouterr().out)
    for m in ("1", "64"):
        row = res["tokens"][m]
        assert row["q4_linear"]["ms"] > 0 and row["xnnpack"]["ms"] > 0
        assert row["q4_linear_over_xnnpack_time"] > 0
    assert res["host"]["machine"]


def test_a_kernel_library_that_does_not_load_is_refused_in_one_line(monkeypatch, tmp_path):
    """The build checks that libharness_kernels.so loads before caching it (the regression: a file
    the compiler left that cannot load, cached and then failing every fast program's load)."""
    from harness.errors import HarnessError
    from harness.runtimes import native

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "kernel_library_command",
                        lambda out, cxx=None: ["sh", "-c", f"echo not-a-library > '{out}'"])
    with pytest.raises(HarnessError, match="does not load"):
        native.kernel_library()
    assert not list(tmp_path.glob("kernels-*/libharness_kernels.so"))


def test_a_non_finite_activation_stays_visible_in_the_kernel_output():
    """A NaN or inf in a token's hidden state must not come out as finite logits (the INT8
    quantization would clamp it to a code): that token's outputs are NaN, the others unchanged."""
    module, head = program(256, 97, 128, softcap=30.0)
    x = torch.randn(1, 3, 256)
    clean = run_path(module, x, "portable")
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[0, 1, 7] = bad
        for path in cpu_paths():  # group 128: every path this CPU has
            got = run_path(module, y, path)
            assert torch.isnan(got[0, 1]).all(), path
            assert torch.equal(torch.isfinite(got[0, [0, 2]]), torch.isfinite(clean[0, [0, 2]])), path
        assert not torch.isfinite(head(y)[0, 1]).all()  # eager: not finite either
