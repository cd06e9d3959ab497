"""Properties over random prompts and lengths (hypothesis), on the loaded .pte programs.

Each .pte is loaded once per session; examples reuse it (a call at position 0 resets the
cache's write counters, and slots past the current position are masked). Profiles: ``ci``
(derandomized, no database), ``dev``, ``debug``, chosen by HYPOTHESIS_PROFILE (conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from conftest import examples
from harness.errors import HarnessError
from harness.generate import greedy
from harness.tolerances import tolerance

pytestmark = pytest.mark.mac

VOCAB = 1024
MAX_CONTEXT = 128
FIRST_PLAIN_ID = 262  # after the 6 specials and 256 byte tokens: ordinary text pieces
tokens = st.integers(0, VOCAB - 1)
plain_tokens = st.integers(FIRST_PLAIN_ID, VOCAB - 1)


def _close(ref: torch.Tensor, got: torch.Tensor, atol: float, what: str) -> None:
    """max |diff| within atol, and the same argmax wherever the reference is not a near-tie
    (top-2 margin under 2 * atol, where the tolerance itself allows a flip)."""
    diff = float((ref - got).abs().max())
    assert diff <= atol, f"{what}: max |diff| {diff:.3e} > {atol}"
    top = ref.topk(2, dim=-1).values
    clear = (top[..., 0] - top[..., 1]) > 2 * atol
    same = ref.argmax(-1) == got.argmax(-1)
    assert bool((same | ~clear).all()), f"{what}: argmax differs at a clear margin"


def _pte(pipeline, recipe):
    return pipeline(recipe).runner.step


recipes = pytest.mark.parametrize("recipe", ["fp32", "8da4w"])


@pytest.fixture
def monkeypatch_runner_calls(pipeline, monkeypatch):
    """Every call that reaches the 8da4w .pte's runtime, recorded."""
    calls: list = []
    runner = pipeline("8da4w").runner
    real = runner.step
    monkeypatch.setattr(runner, "step", lambda ids, pos: (calls.append(tuple(ids.shape)), real(ids, pos))[1])
    return calls


@recipes
@settings(max_examples=examples(12))
@given(data=st.data())
def test_prefill_then_decode_equals_one_pass(pipeline, recipe, data):
    n = data.draw(st.integers(1, 60), label="n")
    k = data.draw(st.integers(1, 16), label="k")
    seq = data.draw(st.lists(tokens, min_size=n + k, max_size=n + k), label="tokens")
    step = _pte(pipeline, recipe)
    whole = step(torch.tensor([seq]), torch.arange(n + k))[0]
    rows = [step(torch.tensor([seq[:n]]), torch.arange(n))[0, -1]]
    for pos in range(n, n + k - 1):
        rows.append(step(torch.tensor([[seq[pos]]]), torch.tensor([pos]))[0, -1])
    got = torch.stack(rows)
    ref = whole[n - 1: n + k - 1]
    _close(ref, got, tolerance(f"pte_vs_exported/{recipe}").atol, f"{recipe} n={n} k={k}")


@recipes
@settings(max_examples=examples(12))
@given(data=st.data())
def test_chunked_prefill_equals_one_prefill(pipeline, recipe, data):
    n = data.draw(st.integers(2, 100), label="n")
    seq = data.draw(st.lists(tokens, min_size=n, max_size=n), label="tokens")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), min_size=1, max_size=6), label="cuts")))
    step = _pte(pipeline, recipe)
    ref = step(torch.tensor([seq]), torch.arange(n))[0]
    parts, start = [], 0
    for end in cuts + [n]:
        parts.append(step(torch.tensor([seq[start:end]]), torch.arange(start, end))[0])
        start = end
    _close(ref, torch.cat(parts), tolerance(f"pte_vs_exported/{recipe}").atol, f"{recipe} cuts={cuts}")


@settings(max_examples=examples(8))
@given(data=st.data())
def test_generation_past_the_sliding_window_matches_hf_generate(pipeline, data):
    """No 511-style cap: prompts and generations that cross the window (16) match transformers'
    generate token for token, up to the 127th position (the exported maximum)."""
    p = pipeline("fp32")
    window = p.loaded.config.sliding_window
    n = data.draw(st.integers(4, 80), label="n")
    prompt = data.draw(st.lists(plain_tokens, min_size=n, max_size=n), label="prompt")
    new = data.draw(st.integers(window, min(48, MAX_CONTEXT - n)), label="new")
    from transformers import GenerationConfig

    model = p.loaded.model
    with torch.no_grad():  # no EOS on either side (an id past the vocab): the full length is compared
        config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=VOCAB + 1, pad_token_id=0,
                                  output_logits=True, return_dict_in_generate=True)
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    ref = out.sequences[0, n:].tolist()
    gen = greedy(p.pte_step(), prompt, new, eos_ids=frozenset(), max_context=MAX_CONTEXT, vocab_size=VOCAB)
    assert len(gen.ids) == len(ref) == new
    if gen.ids != ref:
        i = next(i for i, (a, b) in enumerate(zip(ref, gen.ids)) if a != b)
        top = out.logits[i][0].topk(2).values
        margin = float(top[0] - top[1])
        assert margin < 2 * tolerance("pte_vs_exported/fp32").atol, (
            f"diverged from HF generate at generated position {i} (absolute {n + i}, window {window}): "
            f"HF {ref[i]} vs .pte {gen.ids[i]}, margin {margin:.4f}"
        )


@settings(max_examples=examples(20))
@given(n=st.integers(1, MAX_CONTEXT - 1))
def test_every_length_in_the_exported_range_runs(pipeline, n):
    step = _pte(pipeline, "8da4w")
    out = step(torch.full((1, n), 300, dtype=torch.long), torch.arange(n))
    assert out.shape == (1, n, VOCAB) and bool(torch.isfinite(out).all())


@settings(max_examples=examples(20))
@given(n=st.one_of(st.just(0), st.integers(MAX_CONTEXT, 4 * MAX_CONTEXT)))
def test_lengths_outside_the_range_get_a_clear_error_first(pipeline, n, monkeypatch_runner_calls):
    p = pipeline("8da4w")
    with pytest.raises(HarnessError, match="exceed the exported maximum|empty"):
        p.generate([300] * n, stage="pte", max_new_tokens=1)
    assert monkeypatch_runner_calls == [], "the runtime was called with an out-of-range length"


@settings(max_examples=examples(10))
@given(first=st.lists(tokens, min_size=1, max_size=100), other=st.lists(tokens, min_size=1, max_size=100))
def test_the_pte_is_deterministic(pipeline, first, other):
    step = _pte(pipeline, "8da4w")
    a = step(torch.tensor([first]), torch.arange(len(first))).clone()
    step(torch.tensor([other]), torch.arange(len(other)))  # dirty the cache in between
    b = step(torch.tensor([first]), torch.arange(len(first)))
    assert torch.equal(a, b)


@settings(max_examples=examples(25))
@given(ids=st.lists(tokens, min_size=1, max_size=64))
def test_int8_embedding_error_is_at_most_half_a_step(pipeline, ids):
    p = pipeline("8da4w")
    fp = p.loaded.model.model.embed_tokens_per_layer
    q = p.quantized.model.embed_tokens_per_layer
    idx = torch.tensor(ids)
    with torch.no_grad():
        err = (q(idx) - fp(idx)).abs() / fp.embed_scale
    half_step = q.weight.scale[idx] / 2  # one scale per row
    assert bool((err <= half_step * (1 + 1e-5) + 1e-7).all()), f"max excess {float((err - half_step).max()):.3e}"


@settings(max_examples=examples(25))
@given(x=arrays(np.float32, (3, 256), elements=st.floats(-6, 6, width=32)))
def test_8da4w_linear_error_stays_within_its_scale_bound(pipeline, x):
    """|y_q - y| <= (s_x / 2) * sum|W_q| + sum |x| * s_w / 2 per output: INT8 per-token
    activation rounding plus INT4 per-group weight rounding, from the stored scales."""
    p = pipeline("8da4w")
    fp = p.loaded.model.model.layers[0].mlp.down_proj
    q = p.quantized.model.layers[0].mlp.down_proj
    xt = torch.from_numpy(x)
    with torch.no_grad():
        err = (q(xt) - fp(xt)).abs()
    wq = q.weight.dequantize()
    group = q.weight.block_size[1]
    s_w = q.weight.scale.repeat_interleave(group, dim=1)  # [out, in]
    s_x = (xt.clamp(min=0).amax(-1, keepdim=True) - xt.clamp(max=0).amin(-1, keepdim=True)) / 255
    bound = (s_x / 2) * wq.abs().sum(-1) + (xt.abs() @ (s_w / 2).T)
    assert bool((err <= bound * 1.001 + 1e-5).all()), f"max excess {float((err - bound).max()):.3e}"


# Any character, plus the ones a Gemma tokenizer treats specially. "\u2581" ("▁") is excluded: it is
# the tokenizer's own space marker and decodes to " " (Gemma's tokenizer does the same); this
# property found it, shrunk to the one-character text "▁".
SPACE_MARKER = "\u2581"
PIECES = [" ", "  ", "\n", "\t", "<", ">", "|", "<bos>", "<turn|>", "<0x41>", "é", "日本", "🙂", SPACE_MARKER]
ANY_TEXT = st.lists(st.one_of(st.sampled_from(PIECES), st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)),
                    max_size=10).map("".join)
TEXT = ANY_TEXT.filter(lambda t: SPACE_MARKER not in t)


@settings(max_examples=examples(60))
@given(text=TEXT)
def test_tokenizer_round_trips_random_text(pipeline, text):
    tok = pipeline("fp32").loaded.tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


@settings(max_examples=examples(40))
@given(text=TEXT.filter(lambda t: t.strip()))
def test_chat_template_round_trips_and_runner_tokenizer_agrees(pipeline, text):
    from conftest import FIXTURE_DIR
    from harness.llm_runner import runner_encode

    tok = pipeline("fp32").loaded.tokenizer
    templated = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=False)
    ids = tok.encode(templated, add_special_tokens=False)
    assert tok.decode(ids) == templated
    assert ids[0] == tok.bos_token_id
    # Special-token text typed by a user ("<bos>", "<turn|>") is parsed as the control token, by
    # transformers and by the runner alike (this property found it: text="<bos>"); only plain text
    # is guaranteed a single BOS.
    if not any(special in text for special in tok.all_special_tokens + ["<|turn>", "<turn|>"]):
        assert ids.count(tok.bos_token_id) == 1
    assert runner_encode(FIXTURE_DIR / "tokenizer.json", templated) == ids
