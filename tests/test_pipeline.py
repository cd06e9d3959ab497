"""The pipeline end to end on the fixture: every stage gives the same greedy answer."""

from __future__ import annotations

import pytest

from support import FIXTURE_PROMPTS

pytestmark = pytest.mark.mac


@pytest.mark.parametrize("prompt", FIXTURE_PROMPTS)
def test_answers_identical_across_stages(pipeline, prompt, fixture_answers):
    fp32, q = pipeline("fp32"), pipeline("8da4w")
    answers = {
        "HF generate (fp32)": fp32.hf_generate(prompt),
        "eager wrapper (fp32)": fp32.generate(prompt, stage="eager").ids,
        "exported program (fp32)": fp32.generate(prompt, stage="exported").ids,
        ".pte (fp32)": fp32.generate(prompt, stage="pte").ids,
        "8da4w eager": q.generate(prompt, stage="eager").ids,
        "8da4w exported program": q.generate(prompt, stage="exported").ids,
        "8da4w .pte": q.generate(prompt, stage="pte").ids,
    }
    reference = answers["HF generate (fp32)"]
    diverged = {k: (v, fp32.decode(v)) for k, v in answers.items() if v != reference}
    assert not diverged, f"reference {reference} ({fp32.decode(reference)!r}); diverged: {diverged}"
    assert fp32.decode(reference) == fixture_answers[prompt]


@pytest.mark.parametrize("recipe", ["fp32", "8da4w"])
def test_lowering_reports_delegated_and_portable_ops(pipeline, recipe):
    report = pipeline(recipe).lower_report
    assert report["delegated_calls"] > 0
    assert report["portable_total"] == sum(report["portable_ops"].values())
    # the heavy work is delegated: no matmul, linear or convolution is left to portable kernels
    heavy = [op for op in report["portable_ops"] if any(k in op for k in ("mm", "linear", "conv"))]
    assert not heavy, f"unexpected portable heavy ops: {heavy}"


@pytest.mark.parametrize("recipe", ["fp32", "8da4w"])
def test_pte_carries_runner_metadata(pipeline, recipe):
    p = pipeline(recipe)
    meta = p.runner.metadata()
    assert meta["get_max_context_len"] == p.settings.max_context
    assert meta["get_max_seq_len"] == p.settings.max_seq
    assert meta["get_bos_id"] == p.loaded.config.bos_token_id
    eos = meta["get_eos_ids"]
    eos = eos if isinstance(eos, list) else [eos]
    assert p.loaded.tokenizer.convert_tokens_to_ids("<turn|>") in eos
    assert meta["get_vocab_size"] == p.loaded.config.vocab_size
    assert meta["use_kv_cache"] is True and meta["enable_dynamic_shape"] is True


def test_8da4w_pte_is_smaller_than_fp32(pipeline):
    fp32 = pipeline("fp32").pte_path.stat().st_size
    q = pipeline("8da4w").pte_path.stat().st_size
    assert q < 0.5 * fp32, f"8da4w .pte {q} bytes vs fp32 {fp32}"


def test_second_pipeline_exports_and_lowers_nothing(pipeline):
    from harness.pipeline import Pipeline

    first = pipeline("8da4w")
    first.pte_path
    again = Pipeline("fixture", "8da4w")
    again.pte_path
    events = [e[2] for e in again.cache.events]
    assert events and set(events) == {"hit"}, again.cache.events
    assert again.pte_path == first.pte_path


def test_the_demo_command_answers_and_verifies_as_the_readme_shows(pipeline, capsys, fixture_answers):
    """README's first command, in process, on the session's artifacts: the default recipe's .pte
    answers the demo prompt and equals HF generate token for token (exit 0, the verify line)."""
    from harness.cli.main import DEFAULT_PROMPT, DEMO_RECIPE, main

    pipeline(DEMO_RECIPE).pte_path  # built once per session (usually already, by the fast-path tests)
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert f"recipe:  {DEMO_RECIPE}:" in out
    assert f"answer:  {fixture_answers[DEFAULT_PROMPT]}" in out
    assert "verify: the .pte answer equals HF generate (FP32), token for token" in out
