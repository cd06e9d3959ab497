"""llama.cpp as an independent implementation of Gemma 4 (cross-implementation check).

The committed fixture is converted with llama.cpp's own ``convert_hf_to_gguf.py`` (from the sdist
of the installed llama-cpp-python) and quantized with llama.cpp's quantizer; the prompt goes in as
our token ids (chat-templated), so tokenization is not compared.

- llama.cpp F32, teacher-forced on transformers' ids: the same top-5 ids as transformers' FP32 at
  every prompt position and every generated position (order differences only where transformers
  itself has a near-tie), every logit within ``llamacpp_vs_hf/f32_logits``. This is
  ``harness.goldens.agreement.llamacpp_agreement``, the very function the golden-refresh gate calls.
- llama.cpp Q4_0: the committed fp32 token goldens. A golden refresh that an independent
  implementation disagrees with fails here, even when every ExecuTorch stage moved with it.
- Bad GGUFs (missing, random bytes, a .pte renamed, truncated, corrupt) and unconvertible
  directories give one-line HarnessErrors, never a crash inside llama.cpp.
- Without llama-cpp-python: a failure in CI (CI set), a visible skip elsewhere, with the reason.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from harness.runtimes import gguf as G
from harness.runtimes import llamacpp_setup as S
from harness.errors import HarnessError
from harness.runtimes.base import Generation
from harness.goldens.checks import first_divergence
from harness.goldens.store import GOLDEN_PROMPTS, MAX_NEW_TOKENS, golden_ids, slug
from harness.goldens.agreement import (AGREEMENT_CTX, TOP_K, llamacpp_agreement, position_problems, top_ids,
                                       transformers_prompt_logits)
from harness.runtimes.llamacpp import LlamaCppRuntime
from harness.program import eos_ids
from harness.tolerances import tolerance
from support import skip_without_llama_cpp

pytestmark = pytest.mark.mac

MAX_NEW = MAX_NEW_TOKENS  # as the goldens
LLAMA_CPP_PROBLEM = S.llama_cpp_import_problem()  # None when llama_cpp imports

params = pytest.mark.parametrize("prompt", GOLDEN_PROMPTS, ids=slug)


# ---- llama-cpp-python missing: a failure in CI, a visible skip elsewhere ----------------------------------
def act_on_missing_llama_cpp(problem: str | None, env=None) -> None:
    """``pytest.fail`` (CI) or ``pytest.skip`` (elsewhere) with the one-line reason when
    llama-cpp-python is missing; nothing when it imports."""
    verdict = S.missing_llama_cpp_verdict(problem, env)
    if verdict is None:
        return
    kind, reason = verdict
    if kind == "fail":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def test_llama_cpp_is_installed():
    """The one test that carries the verdict: in CI a missing llama-cpp-python fails here (the
    tests that need it skip, pointing here); elsewhere it is a skip with the reason."""
    act_on_missing_llama_cpp(LLAMA_CPP_PROBLEM)


@pytest.fixture(scope="module")
def needs_llama_cpp():
    skip_without_llama_cpp()


def test_a_build_with_amx_kernels_is_refused_with_the_rebuild_command(monkeypatch):
    """The regression: llama.cpp built with -march=native on an Intel AMX host runs Q4_0 through
    its AMX kernels and segfaults on the first decode (2026-12-05), killing the test process. Such a
    build is refused in one line that says how to rebuild it; a build without them (what tox.ini
    makes, cmake/llamacpp-no-amx.cmake) or the explicit override passes."""
    amx = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | REPACK = 1 | "
    problem = S.amx_problem(amx, env={})
    assert problem is not None and "AMX_INT8 = 1" in problem and "\n" not in problem
    assert S.amx_problem(amx.replace("AMX_INT8 = 1 | ", ""), env={}) is None
    assert S.amx_problem(amx, env={"HARNESS_LLAMACPP_AMX": "1"}) is None

    class AmxBuild:  # the binding as such a build reports itself
        @staticmethod
        def llama_print_system_info():
            return amx.encode()

    monkeypatch.setitem(sys.modules, "llama_cpp", AmxBuild)
    monkeypatch.delenv("HARNESS_LLAMACPP_AMX", raising=False)
    found = S.llama_cpp_import_problem()
    assert found is not None and "AMX" in found and "llamacpp-no-amx.cmake" in found and "\n" not in found
    kind, reason = S.missing_llama_cpp_verdict(found, {"CI": "true"})
    assert kind == "fail" and "--force-reinstall" in reason


def test_missing_llama_cpp_fails_in_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what an environment without it sees
    problem = S.llama_cpp_import_problem()
    assert problem is not None and "llama_cpp (the llama-cpp-python binding) cannot be imported" in problem

    monkeypatch.setenv("CI", "true")
    kind, reason = S.missing_llama_cpp_verdict(problem)
    assert kind == "fail" and "\n" not in reason and "pip install -e '.[dev]'" in reason, reason
    with pytest.raises(pytest.fail.Exception, match=r"cannot be imported .*pip install -e '\.\[dev\]'.*CI is set"):
        act_on_missing_llama_cpp(problem)

    for env in ({"CI": ""}, {}):
        kind, reason = S.missing_llama_cpp_verdict(problem, env)
        assert kind == "skip" and "\n" not in reason and "pip install" in reason, reason
        with pytest.raises(pytest.skip.Exception, match="cannot be imported .*pip install"):
            act_on_missing_llama_cpp(problem, env)
    assert S.missing_llama_cpp_verdict(None, {"CI": "true"}) is None  # installed: nothing to say

    # the gate's entry point says the same, as a HarnessError, before doing anything else
    with pytest.raises(HarnessError, match=r"cannot be imported .*; pip install -e '\.\[dev\]'") as e:
        llamacpp_agreement({"x": Generation(prompt_ids=[2], ids=[5], step_logits=[None])})
    assert "\n" not in str(e.value)


# ---- llama.cpp runners, one per GGUF kind for the module -------------------------------------------
@pytest.fixture(scope="module")
def llama(needs_llama_cpp):
    """``llama(kind)``: one loaded LlamaCppRuntime per GGUF kind for the module."""
    runners: dict = {}

    def get(kind: str) -> LlamaCppRuntime:
        if kind not in runners:
            if kind == "f32":  # as llamacpp_agreement makes it: F32 KV cache, every position's logits
                runners[kind] = LlamaCppRuntime(G.gguf_for("fixture", kind), n_ctx=AGREEMENT_CTX,
                                               kv_type="f32", logits_all=True)
            else:  # as llama.cpp deploys it
                runners[kind] = LlamaCppRuntime(G.gguf_for("fixture", kind), n_ctx=AGREEMENT_CTX, kv_type="f16")
        return runners[kind]

    yield get
    for r in runners.values():
        r.close()


@pytest.fixture(scope="module")
def f32_gguf(needs_llama_cpp):
    return G.gguf_for("fixture", "f32")


def _tok(tok, tid) -> str:
    return "(none: generation ended)" if tid is None else f"{tid} {tok.decode([tid])!r}"


# ---- llama.cpp F32 vs transformers: every prompt position, every generated position -------------------
@params
def test_f32_agrees_with_transformers_at_every_position(prompt, llama, pipeline):
    pipe = pipeline("fp32")
    hf = pipe.hf_run(prompt, MAX_NEW)
    problems = llamacpp_agreement({prompt: hf}, hf_model=pipe.loaded.model, runner=llama("f32"))
    assert not problems, f"{len(problems)} disagreement(s): " + "; ".join(problems[:4])


@pytest.fixture(scope="module")
def france_run(pipeline):
    """transformers' FP32 run on one golden prompt with its prompt logits, for the perturbation tests."""
    pipe = pipeline("fp32")
    prompt = GOLDEN_PROMPTS[0]
    hf = pipe.hf_run(prompt, MAX_NEW)
    hf.prefill_logits = transformers_prompt_logits(pipe.loaded.model, hf.prompt_ids)
    return prompt, hf


def _copy(gen: Generation) -> Generation:
    return Generation(prompt_ids=list(gen.prompt_ids), ids=list(gen.ids),
                      step_logits=[l.clone() for l in gen.step_logits], prefill_logits=gen.prefill_logits.clone())


def test_agreement_reports_a_perturbed_position(france_run, llama):
    """Each check can fail, and says where: a logit off by more than the tolerance at one prompt
    position, a swapped top-1 at another prompt position, a swapped top-1 at a generated position."""
    prompt, hf = france_run
    runner = llama("f32")
    assert llamacpp_agreement({prompt: hf}, runner=runner) == []  # unperturbed: agrees everywhere

    atol = tolerance("llamacpp_vs_hf/f32_logits").atol
    tie = tolerance("llamacpp_vs_hf/f32_tie").atol
    # 1. one logit far down the distribution, at prompt position 3: only the logit check sees it
    bent = _copy(hf)
    low = int(bent.prefill_logits[3].argmin())
    bent.prefill_logits[3, low] += 4 * atol
    problems = llamacpp_agreement({prompt: bent}, runner=runner)
    assert len(problems) == 1 and f"prompt position 3 of {len(hf.prompt_ids)}, id {low}:" in problems[0], problems
    assert "\n" not in problems[0] and f"> {atol}" in problems[0]

    # 2. transformers' top-1 and top-2 exchanged at the prompt position with the clearest top-2 gap
    bent = _copy(hf)
    rows = bent.prefill_logits
    top2 = rows.topk(2, dim=-1)
    p = int((top2.values[:, 0] - top2.values[:, 1]).argmax())
    a, b = (int(i) for i in top2.indices[p])
    assert float(rows[p, a] - rows[p, b]) > tie
    rows[p, a], rows[p, b] = rows[p, b].clone(), rows[p, a].clone()
    problems = llamacpp_agreement({prompt: bent}, runner=runner)
    where = f"prompt position {p} of {len(hf.prompt_ids)}"
    assert any(f"{where}, rank 1: llama.cpp has id {a}" in x and f"transformers has id {b}" in x for x in problems), problems
    assert all(where in x for x in problems), problems

    # 3. the same at a generated position
    bent = _copy(hf)
    j = len(bent.ids) // 2
    v = bent.step_logits[j]
    a, b = (int(i) for i in v.topk(2).indices)
    v[a], v[b] = v[b].clone(), v[a].clone()
    problems = llamacpp_agreement({prompt: bent}, runner=runner)
    assert any(f"generated position {j} (id {hf.ids[j]}), rank 1: llama.cpp has id {a}" in x for x in problems), problems
    assert all(f"generated position {j} " in x for x in problems), problems


def test_the_near_tie_rule():
    """Two ids closer than the tie tolerance in transformers may come out of llama.cpp in either
    order; a swap at a larger gap is a disagreement even when every logit is within its tolerance."""
    import numpy as np

    atol = tolerance("llamacpp_vs_hf/f32_logits").atol
    tie = tolerance("llamacpp_vs_hf/f32_tie").atol
    hf = np.linspace(0.0, -10.0, 64, dtype=np.float32)
    near = hf.copy()
    near[1] = hf[0] - tie / 2  # transformers: ids 0 and 1 a near-tie
    ll = near.copy()
    ll[0], ll[1] = near[1], near[0]  # llama.cpp puts id 1 first
    assert position_problems("p", ll, near, atol, tie) == []

    wide = hf.copy()
    wide[1] = hf[0] - 1.5 * tie  # a clear gap in transformers ...
    ll = wide.copy()
    ll[0] -= 0.8 * tie  # ... that llama.cpp reverses while moving each logit by less than atol
    ll[1] += 0.8 * tie
    assert np.abs(ll - wide).max() <= atol
    problems = position_problems("p", ll, wide, atol, tie)
    assert len(problems) == 2, problems
    assert problems[0].startswith("p, rank 1: llama.cpp has id 1") and f"> tie tolerance {tie}" in problems[0]
    assert problems[1].startswith("p, rank 2: llama.cpp has id 0")


# ---- llama.cpp Q4_0 vs the committed goldens --------------------------------------------------------
@params
def test_q4_0_reproduces_the_goldens(prompt, llama, pipeline):
    golden = golden_ids("fp32", "hf_generate", prompt)
    pipe = pipeline("fp32")
    tok = pipe.loaded.tokenizer
    gen = llama("q4_0").generate(pipe.prompt_ids(prompt), MAX_NEW, eos_ids=eos_ids(pipe.loaded))
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
                  + f", top-2 margin {float(logits[top_ids(logits, 2)[0]] - logits[top_ids(logits, 2)[1]]):.4f}"
                  + f", top-5 {top_ids(logits, TOP_K).tolist()}")
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
    assert meta["llama_cpp_python"] == S.llama_cpp_version()
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
        LlamaCppRuntime(path)


def test_directory_is_not_a_gguf(tmp_path):
    with pytest.raises(HarnessError, match="is not a file; pass the .gguf file itself"):
        G.check_gguf(tmp_path)


def _open(opener: str, path, tmp_path):
    if opener == "check":
        return G.check_gguf(path)
    if opener == "runner":
        return LlamaCppRuntime(path)
    return G.quantize(path, tmp_path / "out-q4_0.gguf", "q4_0")


def test_runner_rejects_ids_outside_the_vocabulary(llama):
    r = llama("f32")
    with pytest.raises(HarnessError, match="token id 5000 is outside the vocabulary \\(0..1023\\)"):
        r.generate([2, 5000], 3)
    with pytest.raises(HarnessError, match="exceed llama.cpp's context of 256"):
        r.generate([2] * 250, 10)


# ---- unconvertible directories -----------------------------------------------------------------------------
def _fixture_copy(tmp_path):
    from harness.models.load import FIXTURE_DIR

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
    monkeypatch.setattr(S, "_run_pip", lambda cmd: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement llama-cpp-python==0.3.36\n"))
    with pytest.raises(HarnessError, match=r"could not download the llama-cpp-python==0\.3\.36 sdist .*"
                                           r"pip download --no-binary :all: --no-deps .*llama-cpp-python==0\.3\.36.*"
                                           r"HARNESS_LLAMA_CPP_SDIST") as e:
        S.converter_dir("0.3.36", root=tmp_path)
    _one_line(e)
    assert not (tmp_path / "llama.cpp-0.3.36").exists()


def test_converter_from_a_bad_local_sdist(tmp_path, monkeypatch):
    bad = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    bad.write_bytes(b"not a tarball")
    monkeypatch.setenv("HARNESS_LLAMA_CPP_SDIST", str(bad))
    with pytest.raises(HarnessError, match="is not a readable sdist"):
        S.converter_dir("0.3.36", root=tmp_path / "cache")
    monkeypatch.setenv("HARNESS_LLAMA_CPP_SDIST", str(tmp_path / "missing.tar.gz"))
    with pytest.raises(HarnessError, match="HARNESS_LLAMA_CPP_SDIST=.* is not a file"):
        S.converter_dir("0.3.36", root=tmp_path / "cache")
    assert not (tmp_path / "cache" / "llama.cpp-0.3.36").exists()


def test_gguf_llama_cpp_cannot_load(tmp_path, needs_llama_cpp):
    """Well-formed GGUF, unknown architecture: llama.cpp's own reason (from its log), one line."""
    import numpy as np

    gguf = S.gguf_py()
    path = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(path), "notanarch")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert G.check_gguf(path).architecture == "notanarch"
    with pytest.raises(HarnessError, match="llama.cpp could not load .*notanarch.*; re-convert") as e:
        LlamaCppRuntime(path)
    _one_line(e)


def test_llama_cpp_not_importable(monkeypatch, f32_gguf):
    from importlib import metadata

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(HarnessError, match="llama_cpp .* cannot be imported .*pip install -e '.\\[dev\\]'"):
        LlamaCppRuntime(f32_gguf)

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(S.metadata, "version", missing)
    with pytest.raises(HarnessError, match="llama-cpp-python is not installed; pip install"):
        S.llama_cpp_version()
