"""Goldens with teeth: each regression an upgrade can bring, injected into one stage, makes the
golden checks (harness.goldens.checks.check_*, what tests/test_goldens.py runs) fail with a message that
names the stage. Each test also shows the unperturbed run passing the same check, so the failure
is the injection's.

The benign moves that must NOT fail (a rescaled per-layer input, a 1e-6 nudge, another summation
order) are in tests/test_tolerance_calibration.py.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from harness.goldens.checks import check_logit_golden, check_prompt_golden, check_token_golden
from harness.goldens.store import GOLDEN_PROMPTS, MAX_NEW_TOKENS, logit_golden_path, read_json_golden

pytestmark = pytest.mark.mac
FRANCE = GOLDEN_PROMPTS[0]
LONG = GOLDEN_PROMPTS[-1]  # its chat-templated prompt is longer than the 16-slot window


def _first_line(problem: str | None) -> str:
    assert problem is not None
    print(f"\nfirst line: {problem.splitlines()[0][:400]}")
    return problem


def _transformed(gen, fn):
    """A copy of a Generation whose step logits went through ``fn(position, logits)``."""
    return dataclasses.replace(gen, step_logits=[fn(i, l.clone()) for i, l in enumerate(gen.step_logits)])


def _greedy(step, p, prompt):
    from harness.runtimes.base import greedy
    from harness.program import eos_ids

    return greedy(step, p.prompt_ids(prompt), MAX_NEW_TOKENS, eos_ids=frozenset(eos_ids(p.loaded)),
                  max_context=p.settings.max_context)


def test_a_tail_token_rising_one_nat_fails_the_logit_golden(stage_runs):
    gen = stage_runs("fp32", "pte", FRANCE)
    assert check_logit_golden("fp32", "pte", FRANCE, gen) is None
    golden = read_json_golden(logit_golden_path("fp32", "pte", FRANCE))
    pos = 2
    tail = int(gen.step_logits[pos].argsort(descending=True)[100])  # far outside the golden top-5
    assert tail not in golden[pos]["ids"]

    def bump(i, logits):
        if i == pos:
            logits[tail] += 1.0  # +1 nat for that token's log-prob (its probability is ~0)
        return logits

    problem = _first_line(check_logit_golden("fp32", "pte", FRANCE, _transformed(gen, bump)))
    assert "fp32:pte" in problem and f"position {pos} token {tail}" in problem


def test_a_constant_shift_of_the_8da4w_pte_logits_fails_the_suite(pipeline):
    """Log-probs, and so every answer and the logit goldens' log-probs, cannot see a constant
    shift, and an 8da4w stage's bias moves by 0.16 under a benign 1e-6 nudge upstream
    (tolerances.py); within one run, though, the .pte's bias against the exported program stays
    under 0.09, so tests/test_numerics.py's comparison (bias bound 0.15) names it."""
    from harness.compare import compare_runs

    p = pipeline("8da4w")
    ids = p.prompt_ids(FRANCE)
    ref = greedy_all(p.exported_step(), p, ids)
    pte = greedy_all(p.pte_step(), p, ids)
    assert compare_runs(ref, pte, "pte_vs_exported/8da4w", "8da4w:exported", "8da4w:pte") is None
    shifted = greedy_all(lambda i, c: p.pte_step()(i, c) + 0.2, p, ids)
    problem = _first_line(compare_runs(ref, shifted, "pte_vs_exported/8da4w", "8da4w:exported", "8da4w:pte"))
    assert "8da4w:pte vs 8da4w:exported" in problem and "bias (mean diff) 0.1" in problem


def greedy_all(step, p, ids):
    from harness.runtimes.base import greedy

    return greedy(step, ids, MAX_NEW_TOKENS, eos_ids=frozenset(), max_context=p.settings.max_context,
                  keep_prefill_logits=True)


def _scaled_linear(model, factor: float):
    """The first quantized gate_proj (torchao stores a per-group scale beside its INT4 codes),
    one scale: row 0, group 0. gate_proj: its output goes through GELU, so no norm undoes it."""
    for name, module in model.named_modules():
        if name.endswith("mlp.gate_proj") and hasattr(module.weight, "scale"):
            module.weight.scale[0, 0] *= factor
            return name
    raise AssertionError("no quantized gate_proj with a scale found")


def test_a_ten_percent_change_of_one_quantization_scale_fails_the_8da4w_goldens(pipeline):
    """One scale (one group of 32 weights of one row) is 10% off. It moves the 8da4w logits by
    ~0.11 log-prob, inside what a benign 1e-6 nudge moves them (0.32: tolerances.py), so the
    quantize stage's own golden (codes exact, scales to 1e-5) is what names it."""
    from harness.goldens.checks import check_quantize_golden
    from harness.goldens.store import quantize_record

    p = pipeline("8da4w")
    model = copy.deepcopy(p.quantized)
    assert check_quantize_golden("8da4w", quantize_record(model)) is None
    where = _scaled_linear(model, 1.1)
    problem = _first_line(check_quantize_golden("8da4w", quantize_record(model)))
    assert "8da4w:quantize" in problem and f"{where}.weight scale[0]" in problem


def test_a_changed_chat_template_fails_the_prompt_golden(pipeline):
    tok = copy.deepcopy(pipeline("fp32").loaded.tokenizer)
    assert check_prompt_golden(FRANCE, tok) is None
    generation_prompt = "{% if add_generation_prompt %}<|turn>model\n"
    assert generation_prompt in tok.chat_template
    tok.chat_template = tok.chat_template.replace(generation_prompt, "{% if add_generation_prompt %}<|turn>model")
    problem = _first_line(check_prompt_golden(FRANCE, tok))
    assert "tokenize (chat template + tokenizer)" in problem and "the chat template renders" in problem


def test_a_changed_tokenizer_normalization_fails_the_prompt_golden(pipeline):
    from tokenizers import normalizers

    tok = copy.deepcopy(pipeline("fp32").loaded.tokenizer)
    backend = tok.backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Lowercase(), backend.normalizer])
    problem = _first_line(check_prompt_golden(FRANCE, tok))
    assert "tokenize (chat template" in problem and "the tokenizer gives ids" in problem


def _shifted_window(phase: str, delta: int):
    """transformers' sliding-window mask with the window one slot off, only in prefill (more than
    one query) or only in decode (one query)."""
    from transformers.models.gemma4 import modeling_gemma4 as g4

    original = g4.create_sliding_window_causal_mask

    def shifted(config, inputs_embeds, *args, **kwargs):
        prefill = inputs_embeds.shape[1] > 1
        if prefill == (phase == "prefill"):
            config = copy.copy(config)
            config.sliding_window = config.sliding_window + delta
        return original(config, inputs_embeds, *args, **kwargs)

    return shifted


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_one_slot_shift_of_the_sliding_window_fails_the_goldens(pipeline, stage_runs, monkeypatch, phase):
    """Prefill: only the golden prompt longer than the window can see it; decode: every answer
    crosses the window."""
    from transformers.models.gemma4 import modeling_gemma4 as g4

    p = pipeline("fp32")
    prompt = LONG
    assert len(p.prompt_ids(prompt)) > p.loaded.config.sliding_window
    monkeypatch.setattr(g4, "create_sliding_window_causal_mask", _shifted_window(phase, -1))
    gen = _greedy(p.eager_step(quantized=False), p, prompt)
    tok = p.loaded.tokenizer
    problem = (check_token_golden("fp32", "eager", prompt, gen, tok)
               or check_logit_golden("fp32", "eager", prompt, gen))
    problem = _first_line(problem)
    assert "fp32:eager" in problem


def _uncapped(cap: float):
    """What an export wrapper that dropped the final logit softcap would return."""
    return lambda logits: torch.atanh((logits / cap).clamp(-0.999999, 0.999999)) * cap


def test_softcapping_dropped_in_the_export_wrapper_only_fails_the_goldens(pipeline, stage_runs):
    p = pipeline("fp32")
    cap = p.loaded.config.final_logit_softcapping
    step = p.eager_step(quantized=False)
    uncap = _uncapped(cap)
    gen = _greedy(lambda ids, pos: uncap(step(ids, pos)), p, FRANCE)
    assert gen.ids == stage_runs("fp32", "eager", FRANCE).ids  # monotone: no argmax moves
    problem = _first_line(check_logit_golden("fp32", "eager", FRANCE, gen))
    assert "fp32:eager" in problem
    # and the comparison of the wrapper with transformers' generate (tests/test_numerics.py) fails too
    from harness.compare import compare_runs

    hf = stage_runs("fp32", "hf_generate", FRANCE)
    assert compare_runs(hf, stage_runs("fp32", "eager", FRANCE), "hf_vs_wrapper/fp32", "hf", "eager") is None
    problem = _first_line(compare_runs(hf, gen, "hf_vs_wrapper/fp32", "fp32:hf_generate", "fp32:eager"))
    assert "fp32:eager vs fp32:hf_generate" in problem
