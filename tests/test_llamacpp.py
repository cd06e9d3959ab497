"""llama.cpp as an independent implementation of Gemma 4 (cross-implementation check).

The committed fixture is converted with llama.cpp's own ``convert_hf_to_gguf.py`` (from the sdist
of the installed llama-cpp-python) and quantized with llama.cpp's quantizer; the prompt goes in as
our token ids (chat-templated), so tokenization is not compared.

- llama.cpp F32: the same greedy answer as transformers, and the same top-5 ids at every generated
  position (order differences allowed only where transformers itself has a near-tie).
- llama.cpp Q4_0: the committed fp32 token goldens. A golden refresh that an independent
  implementation disagrees with fails here, even when every ExecuTorch stage moved with it.
- Bad GGUFs (missing, random bytes, a .pte renamed, truncated, corrupt) and unconvertible
  directories give one-line HarnessErrors, never a crash inside llama.cpp.
"""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import FIXTURE_PROMPTS
from harness.errors import HarnessError
from harness.goldens import first_divergence, slug

pytestmark = pytest.mark.mac

pytest.importorskip(
    "llama_cpp",
    reason="llama-cpp-python is not installed: pip install -e '.[dev]' (it builds llama.cpp from source, ~8 min)",
)

from harness import gguf as G  # noqa: E402
from harness.llamacpp import LlamaCppRunner  # noqa: E402
from harness.pipeline import eos_ids  # noqa: E402

MAX_NEW = 9  # as the goldens
TOP_K = 5
# llama.cpp's CPU GELU (``ggml_vec_gelu_f32``/``geglu`` with GGML_GELU_FP16, compile-time in
# ggml-cpu/vec.h) rounds its input to FP16 and reads an FP16 table, so an "F32" GGUF is not FP32
# end to end: its logits differ from transformers' by up to 3.2e-3 here (2.3e-3 with the F32 KV
# cache used below; measured over every logit of the 6 prompts). Hence:
LOGIT_ATOL = 1e-2  # |llama.cpp - transformers| for each of llama.cpp's top-5 logits
# Two ids whose transformers logits are closer than this may come out in either order from an
# implementation with that much noise (and topk's order among exact ties, gaps under 1e-4, is
# arbitrary even within torch); a swap at a larger gap, or a different id entering the top 5 when
# transformers' 5th and 6th are further apart than this, is a real disagreement.
TIE_TOL = 1e-2

params = pytest.mark.parametrize("prompt", FIXTURE_PROMPTS, ids=slug)


@pytest.fixture(scope="module")
def llama():
    """``llama(kind)``: one loaded LlamaCppRunner per GGUF kind for the module."""
    runners: dict = {}

    def get(kind: str) -> LlamaCppRunner:
        if kind not in runners:
            # F32 with an F32 KV cache (no F16 rounding of K/V); Q4_0 as llama.cpp deploys it
            runners[kind] = LlamaCppRunner(G.gguf_for("fixture", kind), n_ctx=256,
                                           kv_type="f32" if kind == "f32" else "f16")
        return runners[kind]

    yield get
    for r in runners.values():
        r.close()


@pytest.fixture(scope="module")
def f32_gguf():
    return G.gguf_for("fixture", "f32")


def _tok(tok, tid) -> str:
    return "(none: generation ended)" if tid is None else f"{tid} {tok.decode([tid])!r}"


def top5_problems(pos: int, ll_ids: list[int], ll_vals: list[float], hf_logits) -> list[str]:
    """Each rank where llama.cpp's id is not transformers' id there, and the two are not a
    near-tie in transformers' own logits; each top-5 logit further than LOGIT_ATOL from
    transformers' logit for the same id."""
    hf = hf_logits.float()
    vals, ids = hf.topk(TOP_K + 1)
    tail_gap = float(vals[TOP_K - 1] - vals[TOP_K])
    out = []
    for r in range(TOP_K):
        a, b = ll_ids[r], int(ids[r])
        if a != b:
            gap = abs(float(hf[a]) - float(hf[b]))
            if gap > TIE_TOL:
                out.append(
                    f"position {pos}, rank {r + 1}: llama.cpp has id {a} (logit {ll_vals[r]:.5f}; transformers "
                    f"gives it {float(hf[a]):.5f}), transformers has id {b} (logit {float(vals[r]):.5f}); "
                    f"transformers' gap between them {gap:.5f} > tie tolerance {TIE_TOL} "
                    f"(transformers' 5th-6th gap {tail_gap:.5f}; llama.cpp top-5 {ll_ids}, transformers "
                    f"{ids[:TOP_K].tolist()})")
        diff = abs(ll_vals[r] - float(hf[a]))
        if diff > LOGIT_ATOL:
            out.append(f"position {pos}, id {a}: llama.cpp logit {ll_vals[r]:.5f}, transformers {float(hf[a]):.5f} "
                       f"(|diff| {diff:.5f} > {LOGIT_ATOL})")
    return out


# ---- llama.cpp F32 vs transformers ------------------------------------------------------------
@params
def test_f32_top5_equals_transformers(prompt, llama, pipeline):
    pipe = pipeline("fp32")
    tok = pipe.loaded.tokenizer
    hf = pipe.hf_run(prompt, MAX_NEW)
    gen = llama("f32").generate(pipe.prompt_ids(prompt), MAX_NEW, eos_ids=eos_ids(pipe.loaded), top_k=TOP_K)
    pos = first_divergence(hf.ids, gen.ids)
    if pos is not None:
        hf_margin = (float(hf.step_logits[pos].float().topk(2).values.diff().abs())
                     if pos < len(hf.step_logits) else float("nan"))
        pytest.fail(
            f"llama.cpp F32 diverged from transformers on {prompt!r} at generated position {pos}: transformers "
            f"said {_tok(tok, hf.ids[pos] if pos < len(hf.ids) else None)} (top-2 margin {hf_margin:.4f}), "
            f"llama.cpp said {_tok(tok, gen.ids[pos] if pos < len(gen.ids) else None)} "
            f"(margin {gen.margins[pos] if pos < len(gen.margins) else float('nan'):.4f}); "
            f"transformers {hf.ids}, llama.cpp {gen.ids}")
    assert len(gen.top) == len(hf.step_logits) == len(hf.ids)
    problems = [p for pos, ((ids, vals), logits) in enumerate(zip(gen.top, hf.step_logits))
                for p in top5_problems(pos, ids, vals, logits)]
    assert not problems, f"llama.cpp F32 vs transformers on {prompt!r}: " + "; ".join(problems[:4])


# ---- llama.cpp Q4_0 vs the committed goldens --------------------------------------------------------
@params
def test_q4_0_reproduces_the_goldens(prompt, llama, pipeline, golden_tokens_for):
    golden = golden_tokens_for("fp32", "hf_generate", prompt)
    pipe = pipeline("fp32")
    tok = pipe.loaded.tokenizer
    gen = llama("q4_0").generate(pipe.prompt_ids(prompt), MAX_NEW, eos_ids=eos_ids(pipe.loaded),
                                 top_k=TOP_K, keep_logits=True)
    pos = first_divergence(golden, gen.ids)
    if pos is None:
        return
    want = golden[pos] if pos < len(golden) else None
    got = gen.ids[pos] if pos < len(gen.ids) else None
    detail = ""
    if pos < len(gen.step_logits):
        logits = gen.step_logits[pos]
        detail = (f"; llama.cpp Q4_0 logits there: its pick {float(logits[got]):.4f}"
                  + (f", the golden's {float(logits[want]):.4f} (deficit {float(logits[got] - logits[want]):.4f})"
                     if want is not None else "")
                  + f", top-2 margin {gen.margins[pos]:.4f}, top-5 {gen.top[pos][0]}")
    pytest.fail(
        f"llama.cpp Q4_0 disagrees with the fp32 hf_generate golden for {prompt!r} at generated position {pos}: "
        f"golden {_tok(tok, want)}, llama.cpp {_tok(tok, got)}{detail}; golden "
        f"{tok.decode(golden, skip_special_tokens=True)!r}, llama.cpp {tok.decode(gen.ids, skip_special_tokens=True)!r}. "
        "If the goldens were just refreshed, an independent implementation does not confirm the new answer.")


def test_gguf_is_cached_and_keyed_by_llama_cpp_version(f32_gguf):
    from harness.cache import ArtifactCache

    cache = ArtifactCache()
    again = G.gguf_for("fixture", "f32", cache=cache)
    assert again == f32_gguf and cache.events[-1][2] == "hit"
    meta = json.loads((f32_gguf.parent / "meta.json").read_text())
    assert meta["llama_cpp_python"] == G.llama_cpp_version()
    info = G.check_gguf(f32_gguf)
    assert info.architecture == "gemma4" and info.fields["gemma4.attention.shared_kv_layers"] == 2


# ---- bad GGUFs: one line each, from check_gguf, the runner and the quantizer ---------------------------
def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and "; " in msg, msg
    return msg


@pytest.mark.parametrize("opener", ["check", "runner", "quantize"])
def test_missing_gguf(tmp_path, opener):
    path = tmp_path / "nope.gguf"
    with pytest.raises(HarnessError, match="does not exist; convert the model first") as e:
        _open(opener, path, tmp_path)
    _one_line(e)


@pytest.mark.parametrize("opener", ["check", "runner", "quantize"])
def test_random_bytes_are_not_a_gguf(tmp_path, opener):
    import random

    path = tmp_path / "random.gguf"
    path.write_bytes(random.Random(0).randbytes(4096))
    with pytest.raises(HarnessError, match="is not a GGUF file .*re-convert") as e:
        _open(opener, path, tmp_path)
    _one_line(e)


def test_empty_file_is_not_a_gguf(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(HarnessError, match="not a GGUF file \\(an empty file"):
        G.check_gguf(path)


def test_pte_renamed_gguf(tmp_path):
    import torch
    from executorch.exir import to_edge_transform_and_lower

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return x * 2

    ep = torch.export.export(Tiny(), (torch.ones(2),))
    path = tmp_path / "model.gguf"
    path.write_bytes(to_edge_transform_and_lower(ep).to_executorch().buffer)
    for opener in ("check", "runner"):
        with pytest.raises(HarnessError, match="not a GGUF file .*ExecuTorch .pte program") as e:
            _open(opener, path, tmp_path)
        _one_line(e)


@pytest.mark.parametrize("opener", ["check", "runner", "quantize"])
def test_truncated_gguf(tmp_path, f32_gguf, opener):
    data = f32_gguf.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(HarnessError, match=r"is truncated: tensor \S+ ends at byte [\d,]+, the file has [\d,]+; re-convert") as e:
        _open(opener, path, tmp_path)
    _one_line(e)


def test_gguf_cut_inside_its_header(tmp_path, f32_gguf):
    path = tmp_path / "head.gguf"
    path.write_bytes(f32_gguf.read_bytes()[:300])
    with pytest.raises(HarnessError, match="is corrupt or truncated \\(300 bytes; gguf reader: .*re-convert") as e:
        G.check_gguf(path)
    _one_line(e)


def test_gguf_with_a_corrupt_header(tmp_path, f32_gguf):
    data = bytearray(f32_gguf.read_bytes())
    data[8:16] = (2**40).to_bytes(8, "little")  # tensor count
    path = tmp_path / "bad.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(HarnessError, match="is corrupt or truncated .*re-convert") as e:
        G.check_gguf(path)
    _one_line(e)
    with pytest.raises(HarnessError, match="is corrupt or truncated"):
        LlamaCppRunner(path)


def test_directory_is_not_a_gguf(tmp_path):
    with pytest.raises(HarnessError, match="is not a file; pass the .gguf file itself"):
        G.check_gguf(tmp_path)


def _open(opener: str, path, tmp_path):
    if opener == "check":
        return G.check_gguf(path)
    if opener == "runner":
        return LlamaCppRunner(path)
    return G.quantize(path, tmp_path / "out-q4_0.gguf", "q4_0")


def test_runner_rejects_ids_outside_the_vocabulary(llama):
    r = llama("f32")
    with pytest.raises(HarnessError, match="prompt id 5000 is outside the model's vocabulary \\(0..1023\\)"):
        r.generate([2, 5000], 3)
    with pytest.raises(HarnessError, match="exceed llama.cpp's context of 256"):
        r.generate([2] * 250, 10)


# ---- unconvertible directories -----------------------------------------------------------------------------
def _fixture_copy(tmp_path):
    from harness.load import FIXTURE_DIR

    d = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, d)
    return d


def test_convert_a_directory_without_tokenizer(tmp_path):
    d = _fixture_copy(tmp_path)
    (d / "tokenizer.json").unlink()
    out = tmp_path / "out.gguf"
    with pytest.raises(HarnessError, match="has no tokenizer.json, which llama.cpp's converter needs.*; copy the checkpoint's tokenizer") as e:
        G.convert(d, out)
    _one_line(e)
    assert not out.exists()


def test_convert_with_tokenizer_smaller_than_the_vocab(tmp_path):
    d = _fixture_copy(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 1056
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HarnessError, match="the tokenizer has 1024 tokens but the model's vocab_size is 1056.*pad the tokenizer"):
        G.convert(d, tmp_path / "out.gguf")


def test_convert_reports_the_converters_own_failure(tmp_path, f32_gguf):
    """A directory that passes our checks but that llama.cpp's converter rejects: its own reason in
    one line, and the output (here an existing GGUF) left as it was, with no partial file beside it."""
    d = _fixture_copy(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["NotAGemmaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out.gguf"
    shutil.copyfile(f32_gguf, out)
    with pytest.raises(HarnessError, match="converter failed on .*NotAGemmaForCausalLM is not supported.*rerun it by hand") as e:
        G.convert(d, out)
    _one_line(e)
    assert out.read_bytes() == f32_gguf.read_bytes()
    assert not list(tmp_path.glob(".out.gguf.*"))


@pytest.mark.parametrize("layer_types, shared, ok", [
    (["sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
      "sliding_attention", "full_attention"], 2, True),  # the fixture
    (["sliding_attention"] * 3 + ["full_attention"], 0, True),  # no sharing
    (["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
      "full_attention", "sliding_attention"], 2, False),  # layer n_kv-1 sliding: llama.cpp aborts
    (["full_attention", "sliding_attention", "full_attention", "sliding_attention",
      "full_attention", "full_attention"], 2, False),
    (["sliding_attention", "full_attention", "full_attention", "full_attention",
      "full_attention", "full_attention"], 2, True),  # only full layers shared: layer n_kv-2 may be full
])
def test_kv_sharing_layouts(layer_types, shared, ok):
    problem = G.kv_sharing_problem(layer_types, shared)
    assert (problem is None) == ok, problem


def test_convert_refuses_a_layout_llama_cpp_would_abort_on(tmp_path):
    d = _fixture_copy(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                          "full_attention", "sliding_attention"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HarnessError, match="llama.cpp cannot run this KV-sharing layout: shared layer 4"):
        G.convert(d, tmp_path / "out.gguf")


# ---- fetching the converter -----------------------------------------------------------------------------
def test_converter_fetch_failure_names_the_command(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.delenv("HARNESS_LLAMA_CPP_SDIST", raising=False)
    monkeypatch.setattr(G, "_run_pip", lambda cmd: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement llama-cpp-python==0.3.36\n"))
    with pytest.raises(HarnessError, match=r"could not download the llama-cpp-python==0\.3\.36 sdist .*"
                                           r"pip download --no-binary :all: --no-deps .*llama-cpp-python==0\.3\.36.*"
                                           r"HARNESS_LLAMA_CPP_SDIST") as e:
        G.converter_dir("0.3.36", root=tmp_path)
    _one_line(e)
    assert not (tmp_path / "llama.cpp-0.3.36").exists()


def test_converter_from_a_bad_local_sdist(tmp_path, monkeypatch):
    bad = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    bad.write_bytes(b"not a tarball")
    monkeypatch.setenv("HARNESS_LLAMA_CPP_SDIST", str(bad))
    with pytest.raises(HarnessError, match="is not a readable sdist"):
        G.converter_dir("0.3.36", root=tmp_path / "cache")
    monkeypatch.setenv("HARNESS_LLAMA_CPP_SDIST", str(tmp_path / "missing.tar.gz"))
    with pytest.raises(HarnessError, match="HARNESS_LLAMA_CPP_SDIST=.* is not a file"):
        G.converter_dir("0.3.36", root=tmp_path / "cache")
    assert not (tmp_path / "cache" / "llama.cpp-0.3.36").exists()


def test_gguf_llama_cpp_cannot_load(tmp_path):
    """Well-formed GGUF, unknown architecture: llama.cpp's own reason (from its log), one line."""
    import numpy as np

    gguf = G.gguf_py()
    path = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(path), "notanarch")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert G.check_gguf(path).architecture == "notanarch"
    with pytest.raises(HarnessError, match="llama.cpp could not load .*notanarch.*; re-convert") as e:
        LlamaCppRunner(path)
    _one_line(e)


def test_llama_cpp_not_importable(monkeypatch, f32_gguf):
    import sys
    from importlib import metadata

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(HarnessError, match="llama_cpp .* cannot be imported .*pip install -e '.\\[dev\\]'"):
        LlamaCppRunner(f32_gguf)

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(G.metadata, "version", missing)
    with pytest.raises(HarnessError, match="llama-cpp-python is not installed; pip install"):
        G.llama_cpp_version()
