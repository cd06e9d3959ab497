"""Numerics between stages: bit-exact export, the .pte within the tolerance table, round-trips."""

from __future__ import annotations

import pytest
import torch

from support import FIXTURE_PROMPTS, RECIPE_NAMES
from harness.export.torch_export import export_program
from harness.runtimes.base import greedy
from harness.compare import compare_tensors
from harness.runtimes.pytorch import ExportedRuntime
from harness.tolerances import observe, tolerance

pytestmark = pytest.mark.mac
recipes = pytest.mark.parametrize("recipe", RECIPE_NAMES)


def _all_logits(gen):
    return [gen.prefill_logits] + gen.step_logits


def _steps(p, step, prompt):
    return greedy(step, p.prompt_ids(prompt), 9, eos_ids=frozenset(), max_context=p.settings.max_context,
                  keep_prefill_logits=True)


@recipes
def test_exported_logits_are_bit_exact_with_eager(pipeline, recipe):
    """torch.equal for the prefill (every position) and every decode step. This is the one test
    that exports on a warm cache: it checks torch.export itself, in memory."""
    p = pipeline(recipe)
    ep = export_program(p.quantized, p.settings, p.recipe.export)
    for prompt in FIXTURE_PROMPTS[:3]:
        eager = _steps(p, p.eager_step(), prompt)
        exported = _steps(p, ExportedRuntime(ep, settings=p.settings).step, prompt)
        assert eager.ids == exported.ids
        assert tolerance("eager_vs_exported").atol == 0  # bit-exact: compare_tensors then means torch.equal
        for k, (a, b) in enumerate(zip(_all_logits(eager), _all_logits(exported))):
            problem = compare_tensors(a, b, "eager_vs_exported", f"{recipe} eager", f"{recipe} exported",
                                      f"call {k} ({'prefill' if k == 0 else 'decode'}) of {prompt!r}")
            assert problem is None, problem


@recipes
def test_reloaded_pt2_matches_eager_within_tolerance(pipeline, recipe):
    p = pipeline(recipe)
    for prompt in FIXTURE_PROMPTS[:3]:
        eager = _steps(p, p.eager_step(), prompt)
        reloaded = _steps(p, p.exported_step(), prompt)
        assert eager.ids == reloaded.ids
        assert torch.equal(eager.prefill_logits, reloaded.prefill_logits), "prefill must be bit-exact"
        for k, (a, b) in enumerate(zip(_all_logits(eager), _all_logits(reloaded))):
            problem = compare_tensors(a, b, "pt2_reload", f"{recipe} eager", f"{recipe} reloaded .pt2",
                                      f"call {k} of {prompt!r}")
            assert problem is None, problem


@recipes
def test_pte_logits_match_exported_within_tolerance(pipeline, recipe):
    """Every logit of every prompt position and decode step: the largest difference and the mean
    one (a constant shift of the whole vector, invisible to log-probs and argmax, moves the mean)."""
    from harness.compare import compare_runs

    p = pipeline(recipe)
    for prompt in FIXTURE_PROMPTS:
        ref = _steps(p, p.exported_step(), prompt)
        pte = _steps(p, p.pte_step(), prompt)
        problem = compare_runs(ref, pte, f"pte_vs_exported/{recipe}", f"{recipe}:exported", f"{recipe}:pte")
        assert problem is None, f"{prompt!r}: {problem}"


@recipes
def test_export_wrapper_logits_equal_hf_generate(stage_runs, recipe):
    """transformers' generate and the export wrapper run eagerly, on the same model: every logit of
    every generated position, not only the tokens (a final softcap dropped in the wrapper alone is
    monotone: it moves no argmax, only logits; tests/test_golden_teeth.py injects it)."""
    from harness.compare import compare_runs

    for prompt in FIXTURE_PROMPTS:
        problem = compare_runs(stage_runs(recipe, "hf_generate", prompt), stage_runs(recipe, "eager", prompt),
                               f"hf_vs_wrapper/{recipe}", f"{recipe}:hf_generate", f"{recipe}:eager")
        assert problem is None, f"{prompt!r}: {problem}"


@recipes
def test_pte_from_disk_equals_the_in_memory_program(pipeline, recipe):
    from executorch.runtime import Runtime

    p = pipeline(recipe)
    data = p.pte_path.read_bytes()
    method = Runtime.get().load_program(data).load_method("forward")
    ids = torch.tensor([p.prompt_ids(FIXTURE_PROMPTS[0])])
    pos = torch.arange(ids.shape[1])
    from_memory = method.execute([ids, pos])[0]
    from_disk = p.runner.step(ids, pos)
    assert torch.equal(from_memory, from_disk)


def _implied_bytes(model, recipe: str, group: int | None) -> int:
    """Bytes the recipe's quantization implies: packed INT4 weights + FP32 scales per group,
    INT8 per-layer embedding + FP32 row scales, everything else FP32 (tied weights once)."""
    seen, total = set(), 0
    quantized = recipe in ("8da4w", "8da4w-fast")
    int4_table = recipe == "8da4w-fast"  # its token table is INT4 in lm_head's groups
    ple = model.model.embed_tokens_per_layer.weight
    embed = model.model.embed_tokens.weight  # FP32 in every recipe (Gemma slices it directly)
    linears = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.numel()
        if p is embed:
            total += n // 2 + (n // group) * 4 if int4_table else 4 * n
        elif quantized and p is ple:
            total += n + p.shape[0] * 4
        elif quantized and id(p) in linears:
            total += n // 2 + (n // group) * 4
        else:
            total += 4 * n
    if quantized and tied:  # lm_head is quantized separately from the embedding table
        n = model.lm_head.weight.numel()
        total += n // 2 + (n // group) * 4
    return total


@recipes
def test_pte_size_stays_within_what_its_quantization_implies(pipeline, recipe):
    p = pipeline(recipe)
    p.quantized
    group = p.quant_summary.get("group_size")
    implied = _implied_bytes(p.loaded.model, recipe, group)
    size = p.pte_path.stat().st_size
    tol = tolerance(f"pte_size/{recipe}")
    observe(f"pte_size/{recipe}", size / implied)
    assert size <= tol.atol * implied, (
        f"{recipe} .pte is {size:,} bytes, {size / implied:.2f}x the {implied:,} its quantization implies "
        f"(budget {tol.atol}x: {tol.reason}): is a table left unquantized?"
    )


def test_size_budget_catches_an_unquantized_per_layer_embedding(pipeline):
    """The log's 12 GB -> 5 GB story in miniature: the 8da4w .pte plus the FP32 per-layer table
    it would carry if the embedding quantization were lost must break the budget."""
    p = pipeline("8da4w")
    p.quantized
    implied = _implied_bytes(p.loaded.model, "8da4w", p.quant_summary["group_size"])
    ple = p.loaded.model.model.embed_tokens_per_layer.weight.numel()
    with_fp32_table = p.pte_path.stat().st_size + 3 * ple  # 4 bytes instead of 1 per weight
    assert with_fp32_table > tolerance("pte_size/8da4w").atol * implied
