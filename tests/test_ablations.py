"""Every Gemma 4 E2B feature the fixture keeps carries weight: remove it and at least one corpus
answer flips (softcapping, which cannot move an argmax: log-probs move by at least
``ablation/softcap_logprob``).

Each ablation works on a deep copy of the one loaded fixture and is the most direct removal of
the feature that keeps transformers' Gemma 4 runnable:

- per-layer inputs: ``per_layer_inputs = 0`` in every layer. The whole per-layer branch goes:
  ``residual + norm(proj(act(gate(h)) * 0))`` is ``residual``, since RMSNorm(0) = 0.
- KV sharing: the KV-shared layers compute their own K/V from their own input. They have no
  k/v weights, so they use their producer layer's ``k_proj``/``v_proj``/``k_norm``/``v_norm``.
- double-wide MLP: the KV-shared layers' MLP cut to the normal width (the first
  ``intermediate_size`` units of gate/up, the matching columns of down).
- sliding window: sliding layers attend to the whole context (window = max positions).
- larger head size on full layers: full-attention layers keep only the first ``head_dim`` dims
  (of ``global_head_dim``) per head of q/k/v after their norms and RoPE, and the matching
  ``o_proj`` inputs.
- softcapping: ``final_logit_softcapping = None``.

"Flips" is measured teacher-forced on the committed answers (one batched forward per ablation):
an answer flips when the committed token is not the argmax at some answer position, which is
exactly when greedy decoding leaves the committed answer there. The worst flip is confirmed with
HF ``generate``.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from conftest import corpus
from harness.pipeline import encode_prompt, shared_model
from harness.tolerances import tolerance

pytestmark = pytest.mark.mac

EOS = [1, 5]


# ---- measuring ------------------------------------------------------------------------------------
@dataclass
class Corpus:
    rows: list[dict]
    prompts: list[list[int]]
    answers: list[list[int]]  # committed answer ids, <turn|> included
    input_ids: torch.Tensor  # [rows, width], right-padded
    attention: torch.Tensor
    row: torch.Tensor  # per answer position: its corpus row
    at: torch.Tensor  # per answer position: the position whose logits predict it
    target: torch.Tensor  # per answer position: the committed token


def build_corpus(tokenizer) -> Corpus:
    rows = corpus()
    turn_end = tokenizer.convert_tokens_to_ids("<turn|>")
    prompts = [encode_prompt(tokenizer, r["prompt"]) for r in rows]
    answers = [tokenizer.encode(r["answer"], add_special_tokens=False) + [turn_end] for r in rows]
    width = max(len(p) + len(a) for p, a in zip(prompts, answers))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    row, at, target = [], [], []
    for i, (p, a) in enumerate(zip(prompts, answers)):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        attention[i, : len(p) + len(a)] = 1
        row += [i] * len(a)
        at += range(len(p) - 1, len(p) + len(a) - 1)
        target += a
    return Corpus(rows, prompts, answers, ids, attention, torch.tensor(row), torch.tensor(at), torch.tensor(target))


@torch.no_grad()
def answer_logprobs(model, c: Corpus) -> torch.Tensor:
    """log-softmax at every answer position, teacher-forced on the committed answers: [N, vocab]."""
    logits = model(input_ids=c.input_ids, attention_mask=c.attention, use_cache=False).logits.float()
    return logits[c.row, c.at].log_softmax(-1)


@dataclass
class Effect:
    flipped: list[int]  # corpus rows whose greedy answer leaves the committed one
    worst_row: int  # the row with the most negative committed-token margin
    worst_margin: float  # committed token minus the best other token (log-prob = logit gap); < 0: flipped
    max_logprob: float  # largest |log-prob change| of any token at any answer position


def measure(base_lp: torch.Tensor, model, c: Corpus) -> Effect:
    lp = answer_logprobs(model, c)
    gold = lp.gather(-1, c.target[:, None])[:, 0]
    other = lp.scatter(-1, c.target[:, None], float("-inf")).max(-1).values
    margin = gold - other
    worst = int(margin.argmin())
    flipped = sorted(set(c.row[margin < 0].tolist()))
    return Effect(flipped, int(c.row[worst]), float(margin[worst]), float((lp - base_lp).abs().max()))


@torch.no_grad()
def greedy(model, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                         eos_token_id=EOS, pad_token_id=0)
    return out[0, len(prompt):].tolist()


# ---- the checks -----------------------------------------------------------------------------------
def check_flips(feature: str, effect: Effect, model, fx, c: Corpus) -> None:
    """At least one corpus answer flips, clearly (the committed token trails by at least
    ``ablation/flip_margin``), and HF generate agrees on the worst row."""
    need = tolerance("ablation/flip_margin").atol
    numbers = (f"{len(effect.flipped)}/{len(c.rows)} answers flipped {effect.flipped}; worst committed-token "
               f"margin {effect.worst_margin:.3f} (row {effect.worst_row}: {c.rows[effect.worst_row]['prompt']!r}); "
               f"max |log-prob change| {effect.max_logprob:.3f}")
    assert effect.flipped and -effect.worst_margin >= need, (
        f"removing {feature} does not flip any corpus answer by at least {need} logits: {numbers}. "
        f"The fixture does not depend on {feature}: retrain it (harness/train_fixture.py) so that it does.")
    got = greedy(model, c.prompts[effect.worst_row])
    assert got != c.answers[effect.worst_row], (
        f"removing {feature}: teacher forcing says row {effect.worst_row} flips ({numbers}), but HF generate "
        f"still answers {fx.tokenizer.decode(got, skip_special_tokens=True)!r}")


def check_logprobs(feature: str, effect: Effect) -> None:
    need = tolerance("ablation/softcap_logprob").atol
    assert effect.max_logprob >= need, (
        f"removing {feature} moves the answers' log-probs by at most {effect.max_logprob:.4f} "
        f"(< {need}); {len(effect.flipped)} answers flipped. The fixture does not depend on {feature}.")


# ---- the ablations (each returns a modified deep copy) ----------------------------------------------
def no_per_layer_inputs(model):
    m = copy.deepcopy(model)
    inner = m.model
    project = inner.project_per_layer_inputs

    def zero(self, inputs_embeds, per_layer_inputs=None):
        return torch.zeros_like(project(inputs_embeds, per_layer_inputs))

    inner.project_per_layer_inputs = types.MethodType(zero, inner)
    return m


def no_kv_sharing(model):
    m = copy.deepcopy(model)
    cfg, layers = m.config, m.model.layers
    first_shared = cfg.num_hidden_layers - cfg.num_kv_shared_layers
    for i in range(first_shared, cfg.num_hidden_layers):
        producer = max(j for j in range(first_shared) if cfg.layer_types[j] == cfg.layer_types[i])
        attn, src = layers[i].self_attn, layers[producer].self_attn
        assert attn.is_kv_shared_layer and not hasattr(attn, "k_proj"), f"layer {i} is not a KV consumer"
        for name in ("k_proj", "v_proj", "k_norm", "v_norm"):
            setattr(attn, name, copy.deepcopy(getattr(src, name)))
        attn.is_kv_shared_layer = False
        attn.store_full_length_kv = False
    cfg.num_kv_shared_layers = 0  # the cache then gives every layer a KV slot of its own
    m.model.first_kv_shared_layer_idx = cfg.num_hidden_layers
    return m


def no_double_wide_mlp(model):
    m = copy.deepcopy(model)
    n = m.config.intermediate_size
    cut = 0
    for layer in m.model.layers:
        mlp = layer.mlp
        if mlp.intermediate_size != 2 * n:
            continue
        for name in ("gate_proj", "up_proj"):
            old = getattr(mlp, name)
            new = nn.Linear(old.in_features, n, bias=False)
            new.weight.data = old.weight.data[:n].clone()
            setattr(mlp, name, new)
        down = nn.Linear(n, mlp.down_proj.out_features, bias=False)
        down.weight.data = mlp.down_proj.weight.data[:, :n].clone()
        mlp.down_proj, mlp.intermediate_size = down, n
        cut += 1
    assert cut == m.config.num_kv_shared_layers, f"{cut} double-wide MLPs cut"
    return m


def no_sliding_window(model):
    m = copy.deepcopy(model)
    window = m.config.max_position_embeddings
    m.config.sliding_window = window  # masks and the sliding cache layers read it from here
    for layer in m.model.layers:
        if layer.self_attn.is_sliding:
            layer.self_attn.sliding_window = window
    return m


def _small_head_forward(small: int):
    from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb, eager_attention_forward

    keep = torch.arange(small)

    def forward(self, hidden_states, position_embeddings, attention_mask, shared_kv_states, cache=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        cos, sin = position_embeddings
        q = self.q_norm(self.q_proj(hidden_states).view(shape))
        q = apply_rotary_pos_emb(q, cos, sin, unsqueeze_dim=2).transpose(1, 2)[..., keep]
        if self.is_kv_shared_layer:
            k, v = shared_kv_states[self.layer_type]
        else:
            k = self.k_norm(self.k_proj(hidden_states).view(shape))
            k = apply_rotary_pos_emb(k, cos, sin, unsqueeze_dim=2).transpose(1, 2)[..., keep]
            v = self.v_norm(self.v_proj(hidden_states).view(shape)).transpose(1, 2)[..., keep]
            if cache is not None:
                k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        if self.store_full_length_kv:
            shared_kv_states[self.layer_type] = k, v
        out, _ = eager_attention_forward(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling)
        out = out.reshape(*hidden_states.shape[:-1], -1)
        heads = out.shape[-1] // small
        cols = torch.cat([keep + h * self.head_dim for h in range(heads)])
        return nn.functional.linear(out, self.o_proj.weight[:, cols]), None

    return forward


def no_larger_full_head(model):
    m = copy.deepcopy(model)
    kinds = m.config.layer_types
    small = max(l.self_attn.head_dim for l, k in zip(m.model.layers, kinds) if k == "sliding_attention")
    changed = 0
    for layer, kind in zip(m.model.layers, m.config.layer_types):
        attn = layer.self_attn
        if kind == "full_attention":
            assert attn.head_dim > small, (attn.head_dim, small)
            attn.forward = types.MethodType(_small_head_forward(small), attn)
            changed += 1
    assert changed
    return m


def no_softcap(model):
    m = copy.deepcopy(model)
    assert m.config.final_logit_softcapping
    m.config.final_logit_softcapping = None
    return m


def identity(model):
    return copy.deepcopy(model)


# ---- tests ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fx():
    return shared_model("fixture")


@pytest.fixture(scope="module")
def data(fx):
    c = build_corpus(fx.tokenizer)
    base = answer_logprobs(fx.model, c)
    assert bool((base.argmax(-1) == c.target).all()), "the fixture does not reproduce its corpus"
    return c, base


FLIP_ABLATIONS = {
    "per-layer inputs": no_per_layer_inputs,
    "KV sharing": no_kv_sharing,
    "the double-wide MLP": no_double_wide_mlp,
    "the sliding window": no_sliding_window,
    "the larger head size on full layers": no_larger_full_head,
}


# The committed fixture was trained to a top-1 margin of 8 with every feature present, and these
# three removals cut that margin by 0.3-3.3 only: none flips an answer yet. A retrained fixture (an
# ablation-contrast phase after the current recipe) makes them carry weight; until it is committed
# they are known failures, strict: the day they pass, the marker must go.
NOT_YET_LOAD_BEARING = {"KV sharing", "the double-wide MLP", "the larger head size on full layers"}


@pytest.mark.parametrize("feature", [
    pytest.param(f, marks=pytest.mark.xfail(strict=True, reason="the committed fixture does not lean on it yet"))
    if f in NOT_YET_LOAD_BEARING else f for f in FLIP_ABLATIONS])
def test_removing_feature_flips_an_answer(fx, data, feature):
    c, base = data
    model = FLIP_ABLATIONS[feature](fx.model)
    check_flips(feature, measure(base, model, c), model, fx, c)


def test_removing_softcapping_moves_logprobs(fx, data):
    c, base = data
    check_logprobs("final logit softcapping", measure(base, no_softcap(fx.model), c))


def test_the_checks_fail_when_nothing_is_removed(fx, data):
    c, base = data
    model = identity(fx.model)
    effect = measure(base, model, c)
    assert effect.flipped == [] and effect.max_logprob == 0.0, effect
    with pytest.raises(AssertionError, match="does not flip any corpus answer"):
        check_flips("nothing", effect, model, fx, c)
    with pytest.raises(AssertionError, match="does not depend on nothing"):
        check_logprobs("nothing", effect)
