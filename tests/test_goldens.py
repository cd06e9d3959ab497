"""Goldens at every stage: token ids + text (syrupy), top-5 log-probs (numeric, with tolerance).

Stages, in the order a regression is localized: fp32 hf_generate → eager → exported → pte, then
8da4w hf_generate (the quantize step, compared with fp32 hf_generate) → eager → exported → pte.
"""

from __future__ import annotations

import pytest

from conftest import FIXTURE_PROMPTS, RECIPE_NAMES
from harness.golden_diff import golden_path
from harness.goldens import (
    STAGES, compare_logits, explain, logit_golden_path, logit_record, read_json_golden, slug,
    stack_note, token_record, write_json_golden,
)
from harness.tolerances import tolerance

pytestmark = pytest.mark.mac

params = pytest.mark.parametrize("prompt", FIXTURE_PROMPTS, ids=slug)
stages = pytest.mark.parametrize("stage", STAGES)
recipes = pytest.mark.parametrize("recipe", RECIPE_NAMES)


@recipes
@stages
@params
def test_token_golden(golden_tokens, stage_runs, pipeline, updating_goldens, recipe, stage, prompt):
    if not updating_goldens and golden_path(recipe, stage, prompt).is_file():
        read_json_golden(golden_path(recipe, stage, prompt))  # malformed: one clear line, not a text diff
    gen = stage_runs(recipe, stage, prompt)
    tok = pipeline(recipe).loaded.tokenizer
    record = token_record(gen.ids, tok)
    assert golden_tokens == record, (
        f"{recipe}:{stage} changed its answer to {prompt!r}: "
        + explain(recipe, stage, stage_runs.chain(prompt), tok) + _stack(" ")
    )


@recipes
@stages
@params
def test_logit_golden(stage_runs, updating_goldens, recipe, stage, prompt):
    gen = stage_runs(recipe, stage, prompt)
    path = logit_golden_path("fixture", recipe, stage, prompt)
    if updating_goldens:
        write_json_golden(path, logit_record(gen))
        return
    golden = read_json_golden(path)
    tol = tolerance(f"logit_golden/{recipe}")
    bad = compare_logits(golden, gen, tol.atol)
    assert not bad, (
        f"{recipe}:{stage} log-probs for {prompt!r} moved beyond {tol.atol} ({len(bad)} values); first: "
        + "; ".join(str(b) for b in bad[:3]) + _stack(" ")
    )
    assert len(golden) == len(gen.ids), f"golden has {len(golden)} positions, run has {len(gen.ids)}" + _stack(" ")


def _stack(sep: str) -> str:
    """The goldens' provenance when it is not this stack: which versions differ, how to refresh."""
    note = stack_note()
    return f".{sep}{note[0].upper()}{note[1:]}" if note else ""

