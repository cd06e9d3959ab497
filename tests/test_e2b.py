"""Real Gemma 4 E2B goldens (the deployment log's figures). Needs HARNESS_E2B_DIR: a local
Hugging Face snapshot directory of google/gemma-4-E2B-it (offline; nothing downloads)."""

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
PROMPT = "The capital of France is"
# From the deployment log: FP32 and INT4 (8da4w g128 + INT8 per-layer embedding) both give this.
GOLDEN = [818, 5279, 529, 7001, 563, 5213, 50429, 84750, 106]
GOLDEN_TEXT = "The capital of France is **Paris**."


@pytest.fixture(scope="module")
def e2b_pipelines():
    from harness.export import ExportSettings
    from harness.pipeline import Pipeline

    settings = ExportSettings(max_context=128)
    return {r: Pipeline(E2B_DIR, r, settings) for r in ("fp32", "8da4w")}


@needs_e2b
@pytest.mark.parametrize("recipe", ["fp32", "8da4w"])
def test_e2b_eager_answers_match_the_log(e2b_pipelines, recipe):
    p = e2b_pipelines[recipe]
    gen = p.run_stage("hf_generate", PROMPT, max_new_tokens=9)
    assert gen.ids == GOLDEN, f"{recipe}: {gen.ids} {p.decode(gen.ids)!r}"
    assert p.decode(gen.ids) == GOLDEN_TEXT


@needs_e2b
def test_e2b_pte_first_token(e2b_pipelines):
    p = e2b_pipelines["8da4w"]
    gen = p.generate(PROMPT, stage="pte", max_new_tokens=1)
    assert gen.ids[0] == 818
