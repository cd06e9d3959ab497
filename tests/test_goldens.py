"""Goldens at every stage, keyed by (model, recipe, stage, prompt): token ids and text, the whole
logit vector at every generated position (tolerances.py), the chat-templated prompt and its ids,
and each quantized recipe's quality against fp32 (KL, same-top-1).

Stages, in the order a regression is localized: fp32 hf_generate → eager → exported → pte, then
8da4w hf_generate (the quantize step, compared with fp32 hf_generate) → eager → exported → pte.
The checks are harness.goldens.checks.check_*: the teeth tests (test_golden_teeth.py) inject regressions
into the very same functions.
"""

from __future__ import annotations

import pytest

from support import FIXTURE_PROMPTS, RECIPE_NAMES
from harness.goldens.checks import check_logit_golden, check_prompt_golden, check_quality_golden, check_quantize_golden, check_token_golden
from harness.goldens.store import STAGES, quantize_record, slug, token_record

pytestmark = pytest.mark.mac

params = pytest.mark.parametrize("prompt", FIXTURE_PROMPTS, ids=slug)
stages = pytest.mark.parametrize("stage", STAGES)
recipes = pytest.mark.parametrize("recipe", RECIPE_NAMES)


@params
def test_prompt_golden(pipeline, prompt):
    problem = check_prompt_golden(prompt, pipeline("fp32").loaded.tokenizer)
    assert problem is None, problem


@recipes
@stages
@params
def test_token_golden(stage_runs, pipeline, recipe, stage, prompt, token_snapshot):
    """A syrupy snapshot on the golden's own file (tests/support/snapshots.py); a difference is
    localized along the whole stage chain before failing."""
    tok = pipeline(recipe).loaded.tokenizer
    gen = stage_runs(recipe, stage, prompt)
    if token_snapshot(recipe, stage, prompt) == token_record(prompt, gen.ids, tok):
        return
    problem = check_token_golden(recipe, stage, prompt, gen, tok, runs=stage_runs.chain(prompt),
                                 localize=_localize(pipeline, recipe, prompt))
    pytest.fail(problem or f"{recipe}:{stage} {prompt!r}: the ids hold, but the golden file differs from what "
                f"`harness goldens update` writes (its text, now {tok.decode(gen.ids, skip_special_tokens=True)!r}, "
                "or its formatting)")


@recipes
@stages
@params
def test_logit_golden(stage_runs, pipeline, recipe, stage, prompt):
    problem = check_logit_golden(recipe, stage, prompt, stage_runs(recipe, stage, prompt),
                                 localize=_localize(pipeline, recipe, prompt))
    assert problem is None, problem


def _localize(pipeline, recipe, prompt):
    """The activation goldens' line for a failure message: computed only when a golden fails."""
    from harness.goldens.activations import eager_localization

    return lambda: eager_localization(pipeline(recipe).quantized, recipe, prompt)


@pytest.mark.parametrize("recipe", ["8da4w", "8da4w-fast"])
def test_quantize_golden(pipeline, recipe):
    """torchao's INT4/INT8 codes (exactly) and scales for every quantized tensor of the fixture."""
    problem = check_quantize_golden(recipe, quantize_record(pipeline(recipe).quantized))
    assert problem is None, problem


@pytest.mark.parametrize("recipe", ["8da4w", "8da4w-fast"])
def test_quality_golden(computed_goldens, recipe):
    """KL(fp32 || recipe) and same-top-1 over the golden prompts and the whole corpus, teacher-forced
    through the recipe's .pte, as llama.cpp's perplexity tool reports them."""
    problem = check_quality_golden(recipe, computed_goldens.quality[recipe])
    assert problem is None, problem


def test_goldens_diff_finds_nothing_on_this_stack(computed_goldens, capsys):
    """What `harness goldens diff` says on the stack the goldens were recorded under: nothing."""
    from harness.goldens.refresh import diff_main

    status = diff_main(computed=computed_goldens)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "no golden changed" in out
