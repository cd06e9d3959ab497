"""The decode attention mask grows one slot per step; the log's 1-element mask is caught."""

from __future__ import annotations

import pytest

from support import FIXTURE_PROMPTS
from support.attention_probe import AttentionProbe
from harness.goldens.checks import check_tokens
from support.hf_loop import hf_loop_generate
from harness.program import eos_ids

pytestmark = pytest.mark.mac


def _expected_slots(obs, pos, window):
    return pos + 1 if obs.layer_type == "full_attention" else min(pos + 1, window)


def _mask_errors(probe, positions, window):
    errors = []
    for pos, step in zip(positions, probe.decode_steps()):
        for obs in step:
            want = _expected_slots(obs, pos, window)
            if obs.allowed_last_row != want:
                errors.append(f"position {pos}, layer {obs.layer} ({obs.layer_type}): "
                              f"{obs.allowed_last_row} slots, expected {want}")
    return errors


@pytest.mark.parametrize("prompt", FIXTURE_PROMPTS[:2])
def test_exported_wrapper_mask_covers_cache_position_plus_one(pipeline, prompt):
    """At decode step k the attention covers exactly cache_position + 1 slots (full layers) and
    the sliding window on sliding layers; the fixture's window (16) is crossed during decode."""
    p = pipeline("fp32")
    with AttentionProbe(p.loaded.model) as probe:
        gen = p.generate(prompt, stage="eager", max_new_tokens=9)
    positions = gen.cache_positions[1:]
    assert positions and max(positions) >= p.loaded.config.sliding_window, "decode must cross the window"
    assert len(probe.decode_steps()) == len(positions)
    assert _mask_errors(probe, positions, p.loaded.config.sliding_window) == []


def test_hand_written_loop_with_growing_mask_matches_goldens(pipeline, golden_tokens_for):
    p = pipeline("fp32")
    model, tok = p.loaded.model, p.loaded.tokenizer
    for prompt in FIXTURE_PROMPTS:
        with AttentionProbe(model) as probe:
            gen = hf_loop_generate(model, p.prompt_ids(prompt), 9, frozenset(eos_ids(p.loaded)), mask="growing")
        assert len(probe.decode_steps()) == len(gen.cache_positions) - 1 > 0
        assert _mask_errors(probe, gen.cache_positions[1:], model.config.sliding_window) == []
        assert check_tokens(golden_tokens_for("fp32", "hf_generate", prompt), gen, tok, "hf loop") is None


def test_one_element_decode_mask_is_reported_as_divergence(pipeline, golden_tokens_for):
    """The deployment log's "Theodore 2000000" bug: ones((1, 1)) as the decode mask. Both checks
    must fire: the mask probe (wrong slot count) and the golden comparison (a named divergence)."""
    p = pipeline("fp32")
    model, tok = p.loaded.model, p.loaded.tokenizer
    prompt = FIXTURE_PROMPTS[0]
    with AttentionProbe(model) as probe:
        gen = hf_loop_generate(model, p.prompt_ids(prompt), 9, frozenset(eos_ids(p.loaded)), mask="single")
    errors = _mask_errors(probe, gen.cache_positions[1:], model.config.sliding_window)
    assert errors and "1 slots" in errors[0], errors
    report = check_tokens(golden_tokens_for("fp32", "hf_generate", prompt), gen, tok, "hf loop (1-element mask)")
    assert report is not None and "diverged from the golden at generated position" in report, report
