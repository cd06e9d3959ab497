"""Properties over random prompts and lengths (hypothesis), on the loaded .pte programs.

Each .pte is loaded once per session; examples reuse it (a call at position 0 resets the
cache's write counters, and slots past the current position are masked). Profiles: ``ci``
(derandomized, no database), ``dev``, ``debug``, chosen by HYPOTHESIS_PROFILE (conftest.py).
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from support import examples
from harness.errors import HarnessError
from harness.runtimes.base import greedy
from harness.compare import compare_runs, compare_tensors
from harness.runtimes.base import Generation
from harness.tolerances import observe, tolerance

pytestmark = pytest.mark.mac

VOCAB = 1024
MAX_CONTEXT = 128
FIRST_PLAIN_ID = 262  # after the 6 specials and 256 byte tokens: ordinary text pieces
tokens = st.integers(0, VOCAB - 1)
plain_tokens = st.integers(FIRST_PLAIN_ID, VOCAB - 1)


def _close(ref: torch.Tensor, got: torch.Tensor, name: str, what: str) -> None:
    """max |diff| within the named tolerance, and the same argmax wherever the reference is not a
    near-tie (top-2 margin under 2 * atol, where the tolerance itself allows a flip)."""
    atol = tolerance(name).atol
    problem = compare_tensors(ref, got, name, "reference", "run", what)
    assert problem is None, problem
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
    _close(ref, got, f"pte_decode_vs_one_pass/{recipe}", f"{recipe} n={n} k={k}")


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
    _close(ref, torch.cat(parts), f"pte_chunked_vs_one_call/{recipe}", f"{recipe} cuts={cuts}")


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
    hf = Generation(prompt_ids=prompt, ids=out.sequences[0, n:].tolist(), step_logits=[l[0] for l in out.logits])
    gen = greedy(p.pte_step(), prompt, new, eos_ids=frozenset(), max_context=MAX_CONTEXT, vocab_size=VOCAB)
    assert len(gen.ids) == len(hf.ids) == new
    problem = compare_runs(hf, gen, "pte_vs_hf_long/fp32", "HF generate", f".pte (n={n}, window {window})")
    assert problem is None, problem


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
    excess = float((err - half_step).max())  # float rounding of the dequantization itself
    observe("bound/int8_embedding_half_step", max(excess, 0.0))
    assert excess <= tolerance("bound/int8_embedding_half_step").atol, f"max excess {excess:.3e}"


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
    # torchao floors the activation scale at float32's smallest normal: a row of subnormal values
    # (found by this property: one 3.4e-41 among zeros) quantizes to 0, which the bound must allow
    s_x = ((xt.clamp(min=0).amax(-1, keepdim=True) - xt.clamp(max=0).amin(-1, keepdim=True)) / 255).clamp(
        min=torch.finfo(torch.float32).tiny)
    bound = (s_x / 2) * wq.abs().sum(-1) + (xt.abs() @ (s_w / 2).T)
    excess = float((err - bound).max())  # float rounding of both sides
    observe("bound/8da4w_linear", max(excess, 0.0))
    assert excess <= tolerance("bound/8da4w_linear").atol, f"max excess {excess:.3e}"


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


# ExecuTorch's runner tokenizer (pytorch_tokenizers' C++ HFTokenizer, ``_encode``) looks every piece
# up in the model vocabulary before BPE ("Check if the entire word is already a token to skip
# merging") and returns a hit as one id, whatever the file says. Hugging Face tokenizers does that only
# for ``"ignore_merges": true`` (added for tiktoken-style vocabularies, huggingface/tokenizers#1493);
# our tokenizer.json has ``false``, so transformers runs the merges, then byte fallback.
# The two differ only where a piece is a vocabulary entry that no merge produces: in the fixture the 256
# byte-fallback tokens ``<0x00>``..``<0xFF>`` and the padding entries ``<unused703>``..``<unused1023>``
# (train_fixture pads the trained vocabulary to 1024). With no pre-tokenizer, a piece is the text between
# two special tokens, so a user's text hits it only as ``<special>ENTRY`` followed by a special token or
# the end of the content (the template's ``<turn|>``): "<bos><0x41>" gives the runner [2, 71] ("<0x41>"
# read as the byte 0x41, "A") where transformers gives the six characters [2, 66, 263, 309, 58, 264, 68].
# transformers is right: it is what the model was trained on and what the file defines, and the
# runner's ids decode to different text. The cause is upstream (pytorch_tokenizers ignores
# ``ignore_merges``), so the divergence is pinned here exactly: agreement everywhere else, and on this
# class the runner's ids must be transformers' with each such piece replaced by its one id.
RUNNER_WHOLE_PIECE = re.compile(r"<0x[0-9A-F]{2}>|<unused[0-9]+>")
# The chat test also draws members of the class and a near miss ("<unused702>" is no entry: id 702 is a
# trained piece), so the dev profile reaches the class and its edges, not only the pinned examples.
CHAT_PIECES = PIECES + ["<|turn>", "<0xFF>", "<unused703>", "<unused1023>", "<unused702>"]
CHAT_TEXT = st.lists(st.one_of(st.sampled_from(CHAT_PIECES),
                               st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)),
                     max_size=10).map("".join).filter(lambda t: SPACE_MARKER not in t)


@lru_cache(maxsize=1)
def _fixture_spec() -> tuple[dict[str, int], dict[str, int]]:
    """(model vocabulary without added tokens, added tokens) of the committed tokenizer.json."""
    import json

    from support import FIXTURE_DIR

    spec = json.loads((FIXTURE_DIR / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in spec["added_tokens"]}
    vocab = {k: v for k, v in spec["model"]["vocab"].items() if k not in added}
    return vocab, added


def runner_whole_piece(piece: str) -> int | None:
    """The id the runner returns for ``piece`` where it diverges from transformers (None elsewhere)."""
    vocab, _ = _fixture_spec()
    return vocab[piece] if RUNNER_WHOLE_PIECE.fullmatch(piece) and piece in vocab else None


def runner_ids_expected(tok, templated: str, ids: list[int]) -> tuple[list[int], list[str]]:
    """What the runner must give for ``templated``, from transformers' own ids: split at the added
    tokens (as both tokenizers do), and replace each divergent piece's ids by its one id. Also
    returns the divergent pieces found (empty: the runner must equal transformers)."""
    _, added = _fixture_spec()
    pattern = "(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")"
    expected, rebuilt, divergent = [], [], []
    for piece in re.split(pattern, templated):
        if not piece:
            continue
        hf = [added[piece]] if piece in added else tok.encode(piece, add_special_tokens=False)
        rebuilt += hf
        whole = None if piece in added else runner_whole_piece(piece)
        if whole is not None:
            divergent.append(piece)
        expected += hf if whole is None else [whole]
    assert rebuilt == ids, "splitting at the added tokens does not reproduce transformers' ids"
    return expected, divergent


def check_runner_agrees(tok, templated: str, ids: list[int], runner: list[int]) -> None:
    expected, divergent = runner_ids_expected(tok, templated, ids)
    if not divergent:
        assert runner == ids, f"runner tokenizer disagrees with transformers on {templated!r}"
        return
    assert expected != ids, (
        f"RUNNER_WHOLE_PIECE is too wide: transformers already gives {divergent} as one id each")
    assert runner != ids, (
        f"the pinned divergence is gone: the runner now agrees with transformers on the piece(s) "
        f"{divergent} of {templated!r}; drop RUNNER_WHOLE_PIECE")
    assert runner == expected, (
        f"the pinned divergence changed on {divergent} of {templated!r}: runner {runner}, "
        f"expected {expected} (transformers {ids})")


def test_runner_reads_exactly_the_merge_unreachable_vocabulary_whole(pipeline):
    """RUNNER_WHOLE_PIECE is exactly the set of vocabulary entries transformers does not tokenize
    to themselves, and the runner gives each of them as its one id after a special token, and
    every other entry as transformers does."""
    from support import FIXTURE_DIR
    from harness.runtimes.llm_runner import runner_tokenizer

    tok = pipeline("fp32").loaded.tokenizer
    runner = runner_tokenizer(FIXTURE_DIR / "tokenizer.json")
    vocab, added = _fixture_spec()
    bos = added["<bos>"]
    unreachable = {v for v, i in vocab.items() if tok.encode(v, add_special_tokens=False) != [i]}
    pinned = {v for v in vocab if runner_whole_piece(v) is not None}
    assert unreachable == pinned, ("RUNNER_WHOLE_PIECE is not the merge-unreachable vocabulary: "
                                   f"unpinned {sorted(unreachable - pinned)[:5]}, "
                                   f"wrongly pinned {sorted(pinned - unreachable)[:5]}")
    assert len(unreachable) == 256 + 321, len(unreachable)  # byte tokens, <unused703>..<unused1023>
    for v, i in vocab.items():
        typed = v.replace(SPACE_MARKER, " ")
        want = [bos, i] if v in unreachable else [bos] + tok.encode(typed, add_special_tokens=False)
        assert list(runner.encode("<bos>" + typed, 0, 0)) == want, v


def test_the_runner_check_can_fail(pipeline, monkeypatch):
    """check_runner_agrees fails when the runner disagrees outside the class, when the pinned
    divergence disappears or changes, and when the class is widened to a piece transformers
    already gives as one id."""
    import sys

    from support import FIXTURE_DIR
    from harness.runtimes.llm_runner import runner_encode

    tok = pipeline("fp32").loaded.tokenizer

    def case(text):
        templated = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=False)
        ids = tok.encode(templated, add_special_tokens=False)
        return templated, ids, runner_encode(FIXTURE_DIR / "tokenizer.json", templated)

    templated, ids, runner = case("<bos><0x41>")
    check_runner_agrees(tok, templated, ids, runner)  # the pinned divergence, as it is
    assert runner[:6] == [2, 4, 331, 16, 2, 71] and ids[:11] == [2, 4, 331, 16, 2, 66, 263, 309, 58, 264, 68]
    with pytest.raises(AssertionError, match="divergence is gone"):
        check_runner_agrees(tok, templated, ids, ids)
    with pytest.raises(AssertionError, match="divergence changed"):
        check_runner_agrees(tok, templated, ids, [72 if i == 71 else i for i in runner])
    templated, ids, runner = case("<bos>x")
    check_runner_agrees(tok, templated, ids, runner)
    with pytest.raises(AssertionError, match="disagrees with transformers"):
        check_runner_agrees(tok, templated, ids, runner[:-1] + [runner[-1] + 1])
    widened = re.compile(RUNNER_WHOLE_PIECE.pattern + "|x")  # "x" is a trained entry (309)
    monkeypatch.setattr(sys.modules[__name__], "RUNNER_WHOLE_PIECE", widened)
    with pytest.raises(AssertionError, match="too wide"):
        check_runner_agrees(tok, templated, ids, runner)


@settings(max_examples=examples(40))
@given(text=CHAT_TEXT.filter(lambda t: t.strip()))
@example(text="<bos><0x41>")  # runner [.., 2, 71, ..] ("A"); transformers [.., 2, 66, 263, 309, 58, 264, 68, ..]
@example(text="<bos><unused703>")  # the first padding entry: runner 703
@example(text="<turn|><0xFF><bos>")  # a piece between two specials, any byte
@example(text="<bos><0x41>x")  # not a whole piece: agree
@example(text="<bos> <0x41>")  # "▁<0x41>" is no entry: agree
@example(text="<bos><unused702>")  # no vocabulary entry: agree
def test_chat_template_round_trips_and_runner_tokenizer_agrees(pipeline, text):
    from support import FIXTURE_DIR
    from harness.runtimes.llm_runner import runner_encode

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
    # Agreement except on the pinned class above (this property found it: text="<bos><0x41>").
    check_runner_agrees(tok, templated, ids, runner_encode(FIXTURE_DIR / "tokenizer.json", templated))
