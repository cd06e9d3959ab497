"""Real Gemma 4 E2B goldens (the deployment log's figures). Needs HARNESS_E2B_DIR: a local
Hugging Face snapshot directory of google/gemma-4-E2B-it (offline; nothing downloads).

Every stage the tier runs must give the log's whole answer, all 9 ids, greedy, stopping at EOS by
itself; a difference is named by its first position and both tokens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2b

E2B_DIR = os.environ.get("HARNESS_E2B_DIR")
needs_e2b = pytest.mark.skipif(
    not E2B_DIR or not Path(E2B_DIR).is_dir(),
    reason="set HARNESS_E2B_DIR to a local Gemma 4 E2B snapshot directory to run the e2b tier",
)
PROMPT = "The capital of France is"  # a user turn, chat-templated as every harness prompt is
# From the deployment log: FP32 and INT4 (8da4w g128 + INT8 per-layer embedding) both give this,
# ending with EOS (106, <turn|>), which generation keeps.
GOLDEN = [818, 5279, 529, 7001, 563, 5213, 50429, 84750, 106]
GOLDEN_TEXT = "The capital of France is **Paris**."
MAX_NEW_TOKENS = len(GOLDEN) + 1  # room for a 10th token: the answer must stop at EOS by itself
# What the tier runs: transformers' generate on each recipe's model, and the 8da4w .pte.
RUNS = [("fp32", "hf_generate"), ("8da4w", "hf_generate"), ("8da4w", "pte")]


def _token(ids: list[int], pos: int, tokenizer) -> str:
    return f"{ids[pos]} {tokenizer.decode([ids[pos]])!r}" if pos < len(ids) else "nothing (it stopped)"


def difference(got: list[int], want: list[int], tokenizer) -> str | None:
    """None when ``got == want``; else the first differing position and both tokens."""
    pos = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
    if pos is None:
        if len(got) == len(want):
            return None
        pos = min(len(got), len(want))
    return (f"position {pos} of {len(want)} differs: got {_token(got, pos, tokenizer)}, "
            f"the log says {_token(want, pos, tokenizer)}")


@pytest.fixture(scope="module")
def e2b_pipelines():
    from harness.program import ExportSettings
    from harness.pipeline import Pipeline

    settings = ExportSettings(max_context=128)
    return {r: Pipeline(E2B_DIR, r, settings) for r in ("fp32", "8da4w")}


@needs_e2b
@pytest.mark.parametrize("recipe,stage", RUNS, ids=[f"{r}-{s}" for r, s in RUNS])
def test_e2b_answer_matches_the_log(e2b_pipelines, recipe, stage):
    p = e2b_pipelines[recipe]
    gen = p.run_stage(stage, PROMPT, max_new_tokens=MAX_NEW_TOKENS)
    problem = difference(gen.ids, GOLDEN, p.loaded.tokenizer)
    assert problem is None, f"{recipe} {stage}: {problem}; it said {gen.ids} {p.decode(gen.ids)!r}"
    assert p.decode(gen.ids) == GOLDEN_TEXT, f"{recipe} {stage}: the log's ids, but the text {p.decode(gen.ids)!r}"


def test_a_difference_names_its_position_and_both_tokens():
    """The message the tier fails with, on made-up answers (no weights needed)."""

    class Pieces:
        def decode(self, ids):
            return {5213: "**", 84750: "**.", 106: "<turn|>", 1: "<eos>"}.get(ids[0], f"t{ids[0]}")

    tok = Pieces()
    assert difference(GOLDEN, GOLDEN, tok) is None
    assert difference(GOLDEN[:5] + [1234] + GOLDEN[6:], GOLDEN, tok) == (
        "position 5 of 9 differs: got 1234 't1234', the log says 5213 '**'")
    assert difference(GOLDEN[:-1] + [1, 106], GOLDEN, tok) == (
        "position 8 of 9 differs: got 1 '<eos>', the log says 106 '<turn|>'")
    assert difference(GOLDEN + [818], GOLDEN, tok) == (
        "position 9 of 9 differs: got 818 't818', the log says nothing (it stopped)")
    assert difference(GOLDEN[:1], GOLDEN, tok) == (
        "position 1 of 9 differs: got nothing (it stopped), the log says 5279 't5279'")
