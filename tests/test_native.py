"""ExecuTorch's C++ runtime with no Python and no libtorch (harness/runtimes/native.py, the program in
harness/runtimes/cpp/): what a device application links. It must link no libtorch, say what the Python
runtime says (the goldens; logits within a stated tolerance; past the sliding window), refuse bad
input with one line, and hold the peak memory a torch-free runtime should.

Its llama:: kernels (custom_sdpa, update_cache, update_cache_with_indices) are the harness's own:
the executorch wheel ships ExecuTorch's only inside a torch-linked library. They are checked here
against ExecuTorch's kernels (the Python runtime) on small programs that reach every case the
schemas allow and the fixture does not: grouped-query attention with several KV heads, a head
size that is not a multiple of 8, an explicit and a default scale, a mask, causal attention from
a start position, caches written in chunks and through indices."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import FIXTURE_PROMPTS
from harness.compare import compare_tensors
from harness.tolerances import tolerance

pytestmark = pytest.mark.mac
RECIPES = ("fp32", "8da4w", "8da4w-fast")


@pytest.fixture(scope="module")
def binary():
    from harness.runtimes.native import native_runner

    return native_runner()


def run(binary, pte, *args, threads=2, check=True):
    out = subprocess.run([str(binary), str(pte), str(threads), *map(str, args)], capture_output=True, text=True,
                         timeout=600)
    if check:
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])
    return out


def native_logits(binary, pte, ids, chunk=None):
    import torch

    out = run(binary, pte, "--logits", json.dumps(ids), *([chunk] if chunk else []))
    return torch.tensor(out["logits"]).reshape(out["shape"])


def python_logits(pte, ids, chunk=None):
    import torch

    from harness.runtimes.executorch import PteRuntime

    runner = PteRuntime(pte)
    chunk = chunk or len(ids)
    parts = [runner.step(torch.tensor([ids[a:a + chunk]]), torch.arange(a, min(len(ids), a + chunk)))
             for a in range(0, len(ids), chunk)]
    return torch.cat(parts, dim=1)


def test_native_runner_links_no_torch_and_no_python(binary):
    from harness.runtimes.native import linked_libraries

    libs = linked_libraries(binary)
    assert any("libexecutorch.so" in lib for lib in libs), libs
    banned = [lib for lib in libs if any(b in lib for b in ("libtorch", "libc10", "libpython", "custom_ops_aot"))]
    assert not banned, f"the native runner links {banned}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_native_says_the_goldens(binary, pipeline, golden_tokens_for, recipe):
    """Every fixture prompt, greedy through the native runner (no EOS stop: the golden's EOS must
    come where the golden has it), equals the .pte goldens (8da4w-fast's are 8da4w's)."""
    from harness.runtimes.process import isolated

    p = pipeline(recipe)
    with isolated("executorch-native", str(p.pte_path), 2) as child:
        for prompt in FIXTURE_PROMPTS:
            golden = golden_tokens_for("8da4w" if recipe == "8da4w-fast" else recipe, "pte", prompt)
            ids = child.generate(p.prompt_ids(prompt), len(golden)).ids
            assert ids == golden, f"{recipe} native {ids} vs golden {golden} for {prompt!r}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_native_logits_equal_the_python_runtime(binary, pipeline, recipe):
    """Same program, same kernels (but the llama:: ones), same thread count: the prefill logits
    of a prompt longer than the sliding window, and the same prompt fed in chunks of 5."""
    p = pipeline(recipe)
    ids = p.prompt_ids(FIXTURE_PROMPTS[0]) + p.prompt_ids(FIXTURE_PROMPTS[1])[1:] + p.prompt_ids(FIXTURE_PROMPTS[2])[1:]
    assert len(ids) > p.loaded.config.sliding_window
    for chunk in (None, 5):
        problem = compare_tensors(python_logits(p.pte_path, ids, chunk), native_logits(binary, p.pte_path, ids, chunk),
                                  f"native_vs_pte/{recipe}", f"{recipe} .pte (Python runtime)", f"{recipe} native",
                                  f"{len(ids)} ids in chunks of {chunk or len(ids)}")
        assert problem is None, problem


def test_native_fast_long_generation_equals_the_python_runtime(binary, pipeline):
    """60 new tokens, no EOS stop: the sliding layers' ring wraps several times. A flip is accepted
    only at a near-tie of the Python runtime's logits."""
    import torch

    from harness.runtimes.process import isolated
    from harness.runtimes.base import greedy
    from harness.runtimes.executorch import PteRuntime

    p = pipeline("8da4w-fast")
    tol = tolerance("native_long_vs_pte/8da4w-fast").atol
    with isolated("executorch-native", str(p.pte_path), 2) as child:
        for prompt in FIXTURE_PROMPTS[:3]:
            ids = p.prompt_ids(prompt)
            ours = child.generate(ids, 60).ids
            ref = greedy(PteRuntime(p.pte_path).step, ids, 60, max_context=p.settings.max_context)
            first = next((i for i, (a, b) in enumerate(zip(ours, ref.ids)) if a != b), None)
            if first is None:
                continue
            logits = torch.as_tensor(ref.step_logits[first])
            margin = float(logits[ref.ids[first]] - logits[ours[first]])
            assert margin <= 2 * tol, f"{prompt!r}: native leaves the Python runtime at token {first} by {margin}"


def test_native_peak_memory_is_below_the_python_runtimes_libraries(binary, pipeline):
    """The point of the native runner: its whole peak RSS, model included, is below the RSS the
    Python runtime holds before it loads any model (libtorch)."""
    from harness.runtimes.process import measure_once

    p = pipeline("8da4w-fast")
    prompt = p.prompt_ids(FIXTURE_PROMPTS[0])
    native = measure_once("executorch-native", str(p.pte_path), 2, prompt, 8)
    python = measure_once("executorch", str(p.pte_path), 2, prompt, 8)
    assert native["generation"]["ids"] == python["generation"]["ids"]
    assert native["peak_rss_mb"] < python["base_rss_mb"], (native, python)


@pytest.mark.parametrize("bad, message", [
    ([2, 1024], "outside the model's vocabulary [0, 1024)"),
    ([2, -3], "outside the model's vocabulary"),
    ([2] * 200, "exceed the program's"),
])
def test_native_refuses_bad_ids_with_one_line(binary, pipeline, bad, message):
    p = pipeline("8da4w-fast")
    out = run(binary, p.pte_path, "--once", json.dumps(bad), 4, check=False)
    assert out.returncode == 2 and message in out.stderr.strip().splitlines()[-1], out.stderr[-500:]


def test_native_refuses_a_missing_or_broken_pte(binary, tmp_path):
    out = run(binary, tmp_path / "none.pte", "--serve", check=False)
    assert out.returncode == 2 and "cannot read" in out.stderr.strip().splitlines()[-1]
    junk = tmp_path / "junk.pte"
    junk.write_bytes(b"not a program" * 100)
    out = run(binary, junk, "--serve", check=False)
    assert out.returncode == 2 and "cannot load method forward" in out.stderr.strip().splitlines()[-1]


def test_native_runtime_error_names_the_command(pipeline, tmp_path):
    from harness.runtimes.process import isolated
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match="cannot read .*run it by hand: .*et_native"):
        isolated("executorch-native", str(tmp_path / "missing.pte"), 1)


# ---- the llama:: kernels against ExecuTorch's own, on small programs -------------------------------
def _llama_program(kind: str, heads: int, kv_heads: int, head_dim: int, slots: int, scale):
    """forward(input_ids[1, s], cache_position[s]) -> [1, s, heads*head_dim]: q, k, v from fixed
    random embeddings of the ids, written to a cache and attended with llama::custom_sdpa."""
    import torch

    from harness.oplib import load_custom_ops_for_export

    load_custom_ops_for_export()
    torch.manual_seed(0)

    class Attend(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Embedding(64, heads * head_dim)
            self.k = torch.nn.Embedding(64, kv_heads * head_dim)
            self.v = torch.nn.Embedding(64, kv_heads * head_dim)
            self.register_buffer("k_cache", torch.zeros(1, slots, kv_heads, head_dim), persistent=False)
            self.register_buffer("v_cache", torch.zeros(1, slots, kv_heads, head_dim), persistent=False)

        def forward(self, input_ids, cache_position):
            s = input_ids.shape[1]
            q = self.q(input_ids).reshape(1, s, heads, head_dim)
            k = self.k(input_ids).reshape(1, s, kv_heads, head_dim)
            v = self.v(input_ids).reshape(1, s, kv_heads, head_dim)
            start = cache_position[0].item()
            torch._check(start >= 0)
            torch._check(start + s <= slots)
            if kind == "causal":
                torch.ops.llama.update_cache(k, self.k_cache, start)
                torch.ops.llama.update_cache(v, self.v_cache, start)
                out = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, start, None, 0.0, True, scale)
            else:  # indices + an explicit mask over every slot: keys at or before the query, same parity
                idx = cache_position.reshape(1, s)
                torch.ops.llama.update_cache_with_indices(k, self.k_cache, 0, idx)
                torch.ops.llama.update_cache_with_indices(v, self.v_cache, 0, idx)
                kpos = torch.arange(slots).reshape(1, -1)
                qpos = cache_position.reshape(-1, 1)
                ok = (kpos <= qpos) & (torch.remainder(qpos - kpos, 2) == 0)
                mask = torch.where(ok, 0.0, float("-inf")).to(torch.float32)
                out = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, 0, mask, 0.0, False, scale)
            return out.reshape(1, s, heads * head_dim)

    return Attend().eval()


@pytest.mark.parametrize("kind, heads, kv_heads, head_dim, scale", [
    ("causal", 4, 2, 20, None),
    ("causal", 6, 3, 16, 0.3),
    ("causal", 2, 1, 64, 1.0),
    ("masked", 4, 2, 12, None),
    ("masked", 3, 1, 33, 0.5),
])
def test_native_llama_kernels_equal_executorchs(binary, tmp_path, kind, heads, kv_heads, head_dim, scale):
    import torch
    from torch.export import Dim, export

    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    slots = 24
    model = _llama_program(kind, heads, kv_heads, head_dim, slots, scale)
    ids = torch.tensor([[3, 9, 27, 17, 51, 41, 59, 13]])
    seq = Dim("seq", min=1, max=slots)
    with torch.no_grad():
        ep = export(model, (ids, torch.arange(ids.shape[1])), strict=True,
                    dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    with torch.inference_mode():
        program = to_edge_transform_and_lower(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    pte = tmp_path / "attend.pte"
    pte.write_bytes(program.buffer)
    prompt = [int(i) for i in torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(1))]
    for chunk in (None, 1, 7):
        problem = compare_tensors(python_logits(pte, prompt, chunk), native_logits(binary, pte, prompt, chunk),
                                  "native_llama_kernels_vs_executorch", "ExecuTorch's kernels", "the native llama:: kernels",
                                  f"{kind} H={heads} Hkv={kv_heads} D={head_dim} chunks of {chunk}")
        assert problem is None, problem


def test_harness_generate_native_says_what_the_python_runtime_says(pipeline):
    """``harness generate --native`` (the torch-free runner, cut at EOS) prints the same answer and
    ids as ``harness generate`` through the Python runtime."""
    import sys

    pte = str(pipeline("8da4w-fast").pte_path)
    for prompt in FIXTURE_PROMPTS[:3]:
        outs = [subprocess.run([sys.executable, "-m", "harness", "generate", "--pte", pte, "--prompt", prompt, "--ids",
                                *extra], capture_output=True, text=True, timeout=300) for extra in ([], ["--native"])]
        assert all(o.returncode == 0 for o in outs), [o.stderr[-300:] for o in outs]
        assert outs[0].stdout == outs[1].stdout, (prompt, outs[0].stdout, outs[1].stdout)


def test_harness_generate_native_refuses_a_long_request_with_one_line(pipeline):
    """The same one line with and without --native: the harness's guard (the .pte's own limits)
    speaks before either runtime sees the request."""
    import sys

    pte = str(pipeline("8da4w-fast").pte_path)
    outs = [subprocess.run([sys.executable, "-m", "harness", "generate", "--pte", pte, "--prompt", "Hi", *extra,
                            "--max-new-tokens", "500"], capture_output=True, text=True, timeout=300)
            for extra in ([], ["--native"])]
    for out in outs:
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "exceed the exported maximum context of 128" in lines[0], \
            out.stderr
    assert outs[0].stderr == outs[1].stderr


def test_the_runner_measures_read_bandwidth_for_a_device_without_numpy(binary):
    """The pi5 tier's roofline on a device with only pytest: the runner's own read loop. It must
    give a figure within a factor of numpy's loop on the same machine (the two read the same
    bytes; the ratio is measured in one run), refuse a nonsense size in one line, and be taken
    by read_bandwidth when numpy is absent."""
    import builtins

    from harness.bench.roofline import read_bandwidth

    native = run(binary, "-", "--bandwidth", 256)
    assert native["read_gb_s"] > 0 and native["buffer_mb"] == 256
    with_numpy = read_bandwidth(2, buffer_mb=256, repeats=3)
    assert 0.25 < native["read_gb_s"] / with_numpy.read_gb_s < 4, (native, with_numpy)
    bad = run(binary, "-", "--bandwidth", 0, check=False)
    assert bad.returncode != 0 and "MB" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    real_import = builtins.__import__

    def no_numpy(name, *args, **kwargs):
        if name.split(".")[0] == "numpy":
            raise ImportError("numpy is not installed here")
        return real_import(name, *args, **kwargs)

    builtins.__import__ = no_numpy
    try:
        bw = read_bandwidth(2, buffer_mb=256, runner=[str(binary)])
        with pytest.raises(ImportError, match="no read loop"):
            read_bandwidth(2, buffer_mb=256)
    finally:
        builtins.__import__ = real_import
    assert bw.kernel.startswith("native runner") and bw.read_gb_s > 0
