"""One runtime interface: every way of running the fixture (eager, exported, the .pte through
ExecuTorch's Python runtime, TextLLMRunner, the native runner, llama.cpp) is opened by kind, gives
the same answer through ``generate`` as a ``Generation`` with its timings, and obeys the same limits;
any of them runs in a process of its own through the same interface."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.goldens.store import golden_ids
from harness.program import eos_ids
from harness.runtimes.base import Generation, open_runtime
from support import FIXTURE_DIR, skip_without_llama_cpp

pytestmark = pytest.mark.mac

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def fp32(pipeline):
    return pipeline("fp32")


def artifact(kind: str, p):
    if kind == "eager":
        return "fixture"
    if kind == "exported":
        return p.pt2_path
    if kind == "llama.cpp":
        skip_without_llama_cpp()
        from harness.runtimes.gguf import gguf_for

        return gguf_for("fixture", "f32")
    return p.pte_path


def options(kind: str) -> dict:
    return {"tokenizer_json": FIXTURE_DIR / "tokenizer.json"} if kind == "llm-runner" else {}


@pytest.mark.parametrize("kind", ["eager", "exported", "executorch", "llm-runner", "executorch-native", "llama.cpp"])
def test_every_runtime_says_the_golden_through_one_interface(fp32, kind):
    want = golden_ids("fp32", "pte", PROMPT)
    with open_runtime(kind, artifact(kind, fp32), threads=1, **options(kind)) as runtime:
        gen = runtime.generate(fp32.prompt_ids(PROMPT), len(want) + 5, eos_ids=eos_ids(fp32.loaded))
    assert isinstance(gen, Generation) and runtime.kind == kind
    assert gen.ids == want, f"{kind}: {gen.ids} vs the fp32 golden {want}"
    assert gen.stopped_on_eos and gen.prompt_ids == fp32.prompt_ids(PROMPT)
    assert gen.ttft_s > 0 and gen.decode_s > 0 and gen.decode_tok_s > 0


@pytest.mark.parametrize("kind", ["executorch", "eager"])
def test_a_runtime_in_its_own_process_is_the_same_runtime(fp32, kind):
    import os

    from harness.runtimes.process import isolated

    ids = fp32.prompt_ids(PROMPT)
    here = open_runtime(kind, artifact(kind, fp32), threads=1).generate(ids, 6)
    with isolated(kind, artifact(kind, fp32), threads=1) as child:
        assert child.pid != os.getpid() and child.load_s > 0
        there = child.generate(ids, 6)
        with pytest.raises(HarnessError, match="token id 5000 is outside the vocabulary") as err:
            child.generate([2, 5000], 3)  # the child's own guard, one line, and the child lives on
        assert "\n" not in str(err.value)
        again = child.generate(ids, 6)
    assert there.ids == here.ids == again.ids and there.ttft_s > 0


def test_a_runtime_that_owns_its_loop_gives_no_step(fp32):
    from harness.runtimes.native import NativeRuntime

    with NativeRuntime(fp32.pte_path, threads=1) as native:
        with pytest.raises(HarnessError, match="runs its own decoding loop") as err:
            native.step([2], [0])
    assert "\n" not in str(err.value)


def test_every_runtime_refuses_the_same_overrun(fp32):
    """The last new token is never fed: a prompt of n ids and k new tokens needs n + k - 1 slots,
    for every runtime (llama.cpp's loop once refused n + k > ctx, the others n + k - 1 > ctx)."""
    ctx = fp32.settings.max_context
    ids = fp32.prompt_ids(PROMPT)
    fits = ctx - len(ids) + 1
    kinds = ["eager", "executorch"]
    try:
        import llama_cpp  # noqa: F401

        kinds.append("llama.cpp")
    except ImportError:  # tests/test_llamacpp.py says whether that may be skipped
        pass
    for kind in kinds:
        extra = {"n_ctx": ctx} if kind == "llama.cpp" else {}
        with open_runtime(kind, artifact(kind, fp32), threads=1, **extra) as runtime:
            assert len(runtime.generate(ids, fits).ids) == fits, kind
            with pytest.raises(HarnessError, match=f"{fits + 1} new tokens exceed .* of {ctx}"):
                runtime.generate(ids, fits + 1)


def test_an_unknown_kind_names_the_kinds():
    with pytest.raises(HarnessError, match="unknown runtime 'tflite'.*executorch-native"):
        open_runtime("tflite", "x.tflite")
