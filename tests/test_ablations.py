"""Every Gemma 4 E2B feature the fixture keeps carries weight: remove it and at least one corpus
answer flips (softcapping, which cannot move an argmax: log-probs move by at least
``ablation/softcap_logprob``).

Each removal (harness/training/ablations.py, which the fixture's training uses too) works on a deep copy
of the one loaded fixture.

"Flips" is measured teacher-forced on the committed answers (one batched forward per ablation):
an answer flips when the committed token is not the argmax at some answer position, which is
exactly when greedy decoding leaves the committed answer there. The worst flip is confirmed with
HF ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from support import corpus
from harness.training.ablations import FEATURES, without
from harness.export.pipeline import shared_model
from harness.pipeline import encode_prompt
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
        f"The fixture does not depend on {feature}: retrain it (harness/training/fixture.py) so that it does.")
    got = greedy(model, c.prompts[effect.worst_row])
    assert got != c.answers[effect.worst_row], (
        f"removing {feature}: teacher forcing says row {effect.worst_row} flips ({numbers}), but HF generate "
        f"still answers {fx.tokenizer.decode(got, skip_special_tokens=True)!r}")


def check_logprobs(feature: str, effect: Effect) -> None:
    need = tolerance("ablation/softcap_logprob").atol
    assert effect.max_logprob >= need, (
        f"removing {feature} moves the answers' log-probs by at most {effect.max_logprob:.4f} "
        f"(< {need}); {len(effect.flipped)} answers flipped. The fixture does not depend on {feature}.")


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


FLIP_FEATURES = [f for f in FEATURES if f != "softcapping"]


@pytest.mark.parametrize("feature", FLIP_FEATURES)
def test_removing_feature_flips_an_answer(fx, data, feature):
    c, base = data
    model = without(fx.model, feature)
    check_flips(feature, measure(base, model, c), model, fx, c)


def test_removing_softcapping_moves_logprobs(fx, data):
    c, base = data
    check_logprobs("final logit softcapping", measure(base, without(fx.model, "softcapping"), c))


def test_the_checks_fail_when_nothing_is_removed(fx, data):
    c, base = data
    model = without(fx.model, None)
    effect = measure(base, model, c)
    assert effect.flipped == [] and effect.max_logprob == 0.0, effect
    with pytest.raises(AssertionError, match="does not flip any corpus answer"):
        check_flips("nothing", effect, model, fx, c)
    with pytest.raises(AssertionError, match="does not depend on nothing"):
        check_logprobs("nothing", effect)
