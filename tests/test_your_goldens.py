"""Your model's goldens, stage by stage, as pytest tests: ``pytest -m mac --harness-model DIR
[--harness-goldens GOLDENS]`` (or ``HARNESS_MODEL`` / ``HARNESS_MODEL_GOLDENS``). One test per
prompt golden, per (recipe, stage, prompt) token and logit golden, per quantize golden, and the
whole diff, on the goldens ``harness goldens update --model DIR --goldens GOLDENS`` recorded. The
stages are computed once per session (reference, eager, exported, .pte, native runner). Without
``--harness-model`` every test here skips and says how to run it.

tests/test_your_model.py runs the same module on a generated checkpoint, so these tests are seen
to pass on recorded goldens and to fail on a changed one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.mac
HOW = ("no --harness-model: pass your checkpoint, `pytest -m mac --harness-model DIR --harness-goldens GOLDENS` "
       "(docs/your-model.md)")


@contextlib.contextmanager
def _goldens_of(config):
    """HARNESS_GOLDENS_DIR pointed at --harness-goldens while this module looks at them (the
    fixture's tests keep the repository's)."""
    where = config.getoption("--harness-goldens")
    old = os.environ.get("HARNESS_GOLDENS_DIR")
    if where:
        os.environ["HARNESS_GOLDENS_DIR"] = str(Path(where).resolve())
    try:
        yield
    finally:
        if where:
            if old is None:
                os.environ.pop("HARNESS_GOLDENS_DIR", None)
            else:
                os.environ["HARNESS_GOLDENS_DIR"] = old


def _subject(config):
    from harness.goldens.subject import recorded_subject_problem, subject_for

    model = config.getoption("--harness-model")
    if not model:
        return None, None
    with _goldens_of(config):
        subject = subject_for(model)
        return subject, recorded_subject_problem(subject)


def pytest_generate_tests(metafunc):
    subject, problem = _subject(metafunc.config)
    ok = subject is not None and problem is None
    if "node" in metafunc.fixturenames:
        nodes = [(r, s, p) for p in subject.prompts for r, s in subject.chain()] if ok else [None]
        metafunc.parametrize("node", nodes, ids=[f"{n[0]}:{n[1]}:{n[2][:30]}" if n else "none" for n in nodes])
    if "prompt" in metafunc.fixturenames:
        prompts = list(subject.prompts) if ok else [None]
        metafunc.parametrize("prompt", prompts, ids=[p[:30] if p else "none" for p in prompts])
    if "recipe" in metafunc.fixturenames:
        recipes = list(subject.recipes) if ok else [None]
        metafunc.parametrize("recipe", recipes)


@pytest.fixture(scope="module")
def yours(request):
    """(subject, Computed): your checkpoint's stages on this stack, once."""
    from harness.errors import HarnessError
    from harness.goldens.refresh import compute

    subject, problem = _subject(request.config)
    if subject is None:
        pytest.skip(HOW)
    if problem:
        pytest.fail(f"{problem[0]}: {problem[1]}", pytrace=False)
    with _goldens_of(request.config):
        try:
            return subject, compute(subject=subject, progress=lambda m: None)
        except HarnessError as e:
            pytest.fail(str(e), pytrace=False)


@pytest.fixture(autouse=True)
def _their_goldens(request):
    with _goldens_of(request.config):
        yield


def test_your_prompt_golden(yours, prompt):
    from harness.goldens.checks import read_json_golden
    from harness.goldens.store import prompt_golden_path

    subject, c = yours
    want = read_json_golden(prompt_golden_path(prompt, subject.key))
    assert c.prompts[prompt] == want, (f"the chat template or tokenizer changed what {prompt!r} is fed as: "
                                       f"{want['ids']} -> {c.prompts[prompt]['ids']}")


def test_your_token_golden(yours, node):
    from harness.goldens.checks import check_tokens
    from harness.goldens.store import golden_ids

    subject, c = yours
    recipe, stage, prompt = node
    report = check_tokens(golden_ids(recipe, stage, prompt, subject.key), c.runs[node], c.tokenizer, f"{recipe}:{stage}")
    assert report is None, f"{recipe}:{stage} changed its answer to {prompt!r}: {report}"


def test_your_logit_golden(yours, node):
    from harness.goldens.checks import check_logit_golden

    subject, c = yours
    recipe, stage, prompt = node
    if not c.runs[node].step_logits:
        pytest.skip(f"{recipe}:{stage} reports ids, not logits (its golden is its tokens)")
    problem = check_logit_golden(recipe, stage, prompt, c.runs[node], model=subject.key)
    assert problem is None, problem


def test_your_quantize_golden(yours, recipe):
    from harness.goldens.checks import check_quantize_golden

    subject, c = yours
    problem = check_quantize_golden(recipe, c.quantized[recipe], subject.key)
    assert problem is None, problem


def test_your_goldens_diff_is_clean(yours, capsys):
    from harness.goldens.refresh import diff_main

    _, c = yours
    rc = diff_main(computed=c)
    assert rc == 0, capsys.readouterr().out[-4000:]
