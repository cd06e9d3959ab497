"""The fast recipe (``8da4w-fast``, harness/export/fast/): ExecuTorch's custom attention and KV-cache
ops, ring-buffer caches on sliding layers, the decoder delegated to XNNPACK, an INT4 embedding
table. It must say exactly what ``8da4w`` says (its token goldens), keep saying it past the
sliding window, and leave only the portable ops it has a reason for."""

from __future__ import annotations

import pytest

from support import FIXTURE_DIR, FIXTURE_PROMPTS
from harness.compare import compare_tensors

pytestmark = pytest.mark.mac
FAST = "8da4w-fast"
LONG_NEW_TOKENS = 40  # prompt (12-16 ids) + 40 crosses the fixture's 16-slot window twice


def _eos(p) -> list[int]:
    from harness.program import eos_ids

    return eos_ids(p.loaded)


@pytest.mark.parametrize("prompt", FIXTURE_PROMPTS)
def test_fast_pte_equals_8da4w_goldens(pipeline, golden_tokens_for, prompt):
    gen = pipeline(FAST).generate(prompt, stage="pte", max_new_tokens=9)
    golden = golden_tokens_for("8da4w", "pte", prompt)
    assert gen.ids == golden, f"{FAST} .pte {gen.ids} vs 8da4w golden {golden} for {prompt!r}"


@pytest.mark.parametrize("stage", ["eager", "exported"])
def test_fast_wrapper_and_program_equal_8da4w_goldens(pipeline, golden_tokens_for, stage):
    p = pipeline(FAST)
    for prompt in FIXTURE_PROMPTS:
        ids = p.generate(prompt, stage=stage, max_new_tokens=9).ids
        assert ids == golden_tokens_for("8da4w", stage, prompt), f"{FAST}:{stage} {prompt!r}: {ids}"


@pytest.mark.parametrize("stage", ["eager", "exported", "pte"])
def test_fast_logits_are_held_to_8da4w_logit_goldens(pipeline, stage):
    """Not only the tokens: every logit at every generated position within a measured tolerance
    of 8da4w's logit goldens (the same quantization; another attention kernel and cache layout)."""
    from harness.goldens.checks import check_logit_golden
    from harness.goldens.store import MAX_NEW_TOKENS

    p = pipeline(FAST)
    problems = [check_logit_golden("8da4w", stage, prompt, p.generate(prompt, stage=stage, max_new_tokens=MAX_NEW_TOKENS),
                                   held_as=FAST) for prompt in FIXTURE_PROMPTS]
    problems = [x for x in problems if x]
    assert not problems, f"{len(problems)} prompt(s); first: {problems[0]}"


SUPPRESSED = -1e4  # an EOS logit no token can lose to (finite, so both sides compare)


def _no_eos(logits, eos: list[int]):
    logits = logits.clone()
    logits[..., eos] = SUPPRESSED
    return logits


def _suppress(step, eos: list[int]):
    """The step with EOS logits out of reach: what ``generate(min_new_tokens=...)`` does, so both
    sides keep generating past the answer."""
    return lambda ids, pos: _no_eos(step(ids, pos), eos)


@pytest.mark.parametrize("prompt", FIXTURE_PROMPTS[:3] + FIXTURE_PROMPTS[4:5])
def test_fast_pte_long_generation_equals_hf_generate(pipeline, prompt):
    """~40 tokens, well past the 16-slot sliding window (the ring buffer wraps twice), against
    transformers' generate on the same quantized model: every logit up to where they part, and a
    flip accepted only at a near-tie of HF's logits (harness.compare)."""
    import torch

    from harness.compare import compare_runs
    from harness.runtimes.base import Generation, greedy

    p = pipeline(FAST)
    ids = p.prompt_ids(prompt)
    eos = _eos(p)
    with torch.no_grad():
        out = p.quantized.generate(
            torch.tensor([ids]), max_new_tokens=LONG_NEW_TOKENS, min_new_tokens=LONG_NEW_TOKENS,
            do_sample=False, eos_token_id=eos, pad_token_id=p.loaded.config.pad_token_id,
            output_logits=True, return_dict_in_generate=True,
        )
    hf = Generation(prompt_ids=ids, ids=out.sequences[0, len(ids):].tolist(),
                    step_logits=[_no_eos(l[0], eos) for l in out.logits])
    ours = greedy(_suppress(p.pte_step(), eos), ids, LONG_NEW_TOKENS, max_context=p.settings.max_context)
    assert len(ours.ids) == len(hf.ids) == LONG_NEW_TOKENS
    problem = compare_runs(hf, ours, "fast_vs_hf_long/8da4w-fast", "HF generate", f"{FAST} .pte")
    assert problem is None, f"{prompt!r}: {problem}"


def test_fast_pte_prefill_past_the_window_in_one_call(pipeline):
    """A 75-token prompt in one call (longer than the 16-slot ring: the ring keeps the last 16,
    the rest goes to the trash slot) gives the same logits as transformers' forward."""
    import torch

    p = pipeline(FAST)
    ids = p.prompt_ids(FIXTURE_PROMPTS[0])
    with torch.no_grad():
        seq = p.quantized.generate(torch.tensor([ids]), max_new_tokens=60, min_new_tokens=60,
                                   do_sample=False, pad_token_id=p.loaded.config.pad_token_id)[0]
        ref = p.quantized(seq[None]).logits[0]
    runner = p.runner
    runner.step(torch.tensor([ids]), torch.arange(len(ids)))  # stale ring contents first
    got = runner.step(seq[None], torch.arange(len(seq)))[0]
    problem = compare_tensors(ref, got, "fast_prefill_vs_hf/8da4w-fast", "transformers (8da4w model)",
                              "8da4w-fast .pte", f"a one-call prefill of {len(seq)}")
    assert problem is None, problem


def test_fast_pte_portable_ops_have_reasons(pipeline):
    """Every operator left outside XNNPACK is one harness/export/fast/ explains, within the count its
    reason implies for this model; the norms, RoPE and every matmul are delegated."""
    from harness.export.fast.budget import portable_op_budget

    p = pipeline(FAST)
    report = p.lower_report
    budget = portable_op_budget(p.loaded.config)
    unexplained = {op: n for op, n in report["portable_ops"].items() if op not in budget}
    assert not unexplained, f"portable ops without a reason: {unexplained}"
    over = {op: (n, budget[op][0]) for op, n in report["portable_ops"].items() if n > budget[op][0]}
    assert not over, f"portable ops above their budget (count, budget): {over}"
    ceiling = sum(n for n, _ in budget.values())
    assert report["portable_total"] <= ceiling
    assert report["delegated_calls"] <= p.loaded.config.num_hidden_layers + 2, report["delegated_calls"]


def test_fast_pte_stores_the_token_table_once(pipeline):
    """The tied table is one INT4 copy, read by the lookup (embedding_4bit) and by lm_head
    (harness::q4_linear, harness/export/fast/tied.py); 8da4w, whose FP32 table and XNNPACK-packed
    lm_head are two copies, shows the check fails on a program that stores it twice."""
    from harness.bench.scale import token_table_copies

    cfg = pipeline(FAST).loaded.config
    fast = token_table_copies(pipeline(FAST).pte_path, cfg.vocab_size, cfg.hidden_size)
    assert len(fast) == 1, fast
    twice = token_table_copies(pipeline("8da4w").pte_path, cfg.vocab_size, cfg.hidden_size)
    assert len(twice) == 2, twice


def test_fast_pte_is_smaller_than_8da4w(pipeline):
    """The INT4 embedding table replaces the FP32 one 8da4w keeps for the tied embedding."""
    fast = pipeline(FAST).pte_path.stat().st_size
    base = pipeline("8da4w").pte_path.stat().st_size
    assert fast < base, f"{FAST} .pte {fast} bytes vs 8da4w {base}"


def test_fast_pte_metadata_says_sdpa_with_kv_cache(pipeline):
    meta = pipeline(FAST).runner.metadata()
    assert meta["use_sdpa_with_kv_cache"] is True
    assert meta["use_kv_cache"] is True and meta["enable_dynamic_shape"] is True


def test_fast_pte_in_executorch_llm_runner(pipeline, golden_tokens_for):
    """ExecuTorch's own LLM runner (the device path) finds the custom op kernels and says what
    the 8da4w goldens say."""
    from harness.runtimes.llm_runner import TextLLMRuntime

    p = pipeline(FAST)
    runner = TextLLMRuntime(p.pte_path, FIXTURE_DIR / "tokenizer.json")
    for prompt in FIXTURE_PROMPTS:
        text = p.loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                      add_generation_prompt=True, tokenize=False)
        out = runner.generate_text(text, max_new_tokens=9)
        assert out.ids == golden_tokens_for("8da4w", "pte", prompt), f"{prompt!r}: {out.ids} {out.text!r}"


def _whole_table_floats(ep, shape) -> list[str]:
    """Nodes of an exported program that make a float tensor of the table's whole shape."""
    out = []
    for node in ep.graph_module.graph.nodes:
        val = node.meta.get("val")
        if node.op == "call_function" and hasattr(val, "shape") and val.dtype.is_floating_point \
                and all(isinstance(d, int) for d in val.shape) and tuple(val.shape) == tuple(shape):
            out.append(f"{node.target}")
    return out


def test_the_per_layer_table_is_gathered_row_first_never_dequantized_whole(pipeline):
    """torchao's lookup of an INT8-per-row table dequantizes all of it on every call: at E2B size
    9.4 GB of float32 per step of the eager model and of the exported .pt2, which took
    ``goldens update`` on an E2B-shaped checkpoint past 23 GiB until it was killed. The fast
    wrapper gathers the rows' codes, zero points and scales first (harness/export/fast/embedding.py):
    bit-exact with torchao's lookup, and no tensor of the table's size in the program."""
    import torch

    from harness.export.fast.embedding import GatheredTable, gathered_table

    p = pipeline(FAST)
    table = p.quantized.model.embed_tokens_per_layer
    shape = tuple(table.weight.shape)
    ids = torch.tensor([[2, 105, 7, 9, shape[0] - 1]])
    rows = gathered_table(table)
    assert isinstance(rows, GatheredTable)
    assert torch.equal(rows(ids), table(ids)), "the gathered lookup is not bit-exact with torchao's"

    class Lookup(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(ids)

    whole = _whole_table_floats(torch.export.export(Lookup(table), (ids,)), shape)
    assert whole, "torchao's own lookup should dequantize the whole table (the check would see nothing)"
    assert not _whole_table_floats(torch.export.export(Lookup(rows), (ids,)), shape)
    assert not _whole_table_floats(p.exported, shape), "the exported fast program dequantizes the whole table"


@pytest.mark.parametrize("shape", ["fixture", "e2b", "small", "small-unshared"])
def test_kv_sharing_is_read_the_same_from_a_release_without_kv_sharing_modes(shape):
    """transformers 5.22's config has no ``kv_sharing_modes`` (the compatibility matrix found the fast
    path stopping there): the harness derives it from ``num_kv_shared_layers`` as 5.22's attention
    layers do, and the derivation equals 5.23+'s property on every shape the harness builds."""
    import types

    from transformers import Gemma4TextConfig

    from harness.export.fast.sharing import kv_sharing_modes
    from harness.training.synthetic import text_config

    if shape == "fixture":
        import json

        raw = json.loads((FIXTURE_DIR / "config.json").read_text())
        config = Gemma4TextConfig(**raw.get("text_config", raw))
    elif shape == "small-unshared":
        config = Gemma4TextConfig(**{**text_config("small"), "num_kv_shared_layers": 0})
    else:
        config = Gemma4TextConfig(**text_config(shape))
    old = types.SimpleNamespace(num_hidden_layers=config.num_hidden_layers, layer_types=list(config.layer_types),
                                num_kv_shared_layers=config.num_kv_shared_layers)  # what 5.22 holds
    modes = kv_sharing_modes(old)
    assert modes == list(config.kv_sharing_modes), (modes, config.kv_sharing_modes)
    if config.num_kv_shared_layers:
        assert "reuse" in modes and "store" in modes
        broken = types.SimpleNamespace(**{**vars(old), "num_kv_shared_layers": config.num_kv_shared_layers - 1})
        assert kv_sharing_modes(broken) != modes, "the derivation ignores num_kv_shared_layers"
