"""The golden checks the tests run (and the teeth tests inject regressions into): token ids, whole logit
vectors, prompts, quantization quality and torchao's codes and scales, each failure explained where
it first happened, with the stack note first when the stack moved."""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import HarnessError
from harness.goldens.store import UPDATE_COMMAND, golden_ids, logit_golden_path, predecessor, prompt_golden_path, prompt_record, quality_golden_path, quantize_golden_path, read_json_golden, unpack_logits
from harness.goldens.provenance import stack_note

# ---- comparisons ------------------------------------------------------------------------------
def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margin_at(gen, position: int) -> float | None:
    """Top-1 minus top-2 logit at a generated position (None if not recorded)."""
    if gen is None or position >= len(gen.step_logits):
        return None
    top = gen.step_logits[position].float().topk(2).values
    return float(top[0] - top[1])


def golden_margin(record: list[dict], position: int) -> float | None:
    """Top-2 logit margin at a position of a logit golden (log-prob gaps equal logit gaps)."""
    if position >= len(record):
        return None
    lp = record[position]["logprobs"]
    return float(lp[0] - lp[1])


def is_near_tie(margin: float | None) -> bool:
    """A top-2 logit margin small enough that benign numerics can flip it (``refresh/near_tie``)."""
    from harness.tolerances import tolerance

    return margin is not None and margin < tolerance("refresh/near_tie").atol


def _tok(tokenizer, tid: int | None) -> str:
    if tid is None:
        return "(none: generation ended)"
    return f"{tid} {tokenizer.decode([tid])!r}"


def explain(recipe: str, stage: str, runs: dict, tokenizer) -> str:
    """Walk back along the stage chain to the first stage that differs from the stage before it,
    and describe where and how: position, both tokens, the top-2 logit margin there."""
    node = (recipe, stage)
    culprit = None
    while (prev := predecessor(*node)) is not None:
        a, b = runs.get(prev), runs.get(node)
        if a is None or b is None:
            break
        if a.ids != b.ids:
            culprit = (prev, node)
        node = prev
    if culprit is None:
        return "every stage before it agrees with the stage before it (the golden itself changed?)"
    prev, node = culprit
    a, b = runs[prev], runs[node]
    pos = first_divergence(a.ids, b.ids)
    want = a.ids[pos] if pos < len(a.ids) else None
    got = b.ids[pos] if pos < len(b.ids) else None
    m_prev, m_node = margin_at(a, pos), margin_at(b, pos)
    text = (f"stage {node[0]}:{node[1]} first diverged from {prev[0]}:{prev[1]} at generated position "
            f"{pos}: {prev[1]} said {_tok(tokenizer, want)}, {node[1]} said {_tok(tokenizer, got)}")
    if m_prev is not None:
        text += f"; top-2 logit margin there {m_prev:.3f} in {prev[1]}"
        if m_node is not None:
            text += f", {m_node:.3f} in {node[1]}"
        text += " (a near-tie: numerics, not necessarily a bug)" if is_near_tie(m_prev) else " (a clear margin: a regression)"
    return text


def check_tokens(golden_ids: list[int], gen, tokenizer, label: str) -> str | None:
    """None if ``gen`` reproduces the golden ids, else one line: position, both tokens, margin."""
    pos = first_divergence(golden_ids, gen.ids)
    if pos is None:
        return None
    want = golden_ids[pos] if pos < len(golden_ids) else None
    got = gen.ids[pos] if pos < len(gen.ids) else None
    m = margin_at(gen, pos)
    return (f"{label} diverged from the golden at generated position {pos}: golden {_tok(tokenizer, want)}, "
            f"got {_tok(tokenizer, got)}" + (f"; top-2 margin there {m:.3f}" if m is not None else "")
            + f"; golden text {tokenizer.decode(golden_ids, skip_special_tokens=True)!r}, "
            f"got {tokenizer.decode(gen.ids, skip_special_tokens=True)!r}")


@dataclass
class LogitDiff:
    """How far a run's logits are from a logit golden, over the positions both share (a position
    after the first token change is not comparable: its context differs)."""
    positions: int
    max_logprob: float = 0.0  # largest |change| of any log-prob (shift-invariant: what answers see)
    max_at: tuple[int, int] = (0, -1)  # (position, token id) of it
    bias: float = 0.0  # largest, over positions, |mean change| of the raw logits (a constant shift)
    bias_at: int = 0
    max_abs: float = 0.0  # largest |change| of any raw logit, for the record
    missing: int = 0  # golden positions the run did not reach
    sketch_bucket: int | None = None  # a compact golden: the sketch bucket that moved most, if it was the worst

    def within(self, tol, multiple: float = 1.0) -> bool:
        return (self.missing == 0 and self.max_logprob <= multiple * tol.atol
                and (tol.mean is None or self.bias <= multiple * tol.mean))

    def describe(self, tol=None) -> str:
        where = (f"sketch bucket {self.sketch_bucket} (likeliest token {self.max_at[1]})" if self.sketch_bucket is not None
                 else f"token {self.max_at[1]}")
        text = (f"max |log-prob change| {self.max_logprob:.4g} at position {self.max_at[0]} {where}, "
                f"logit bias {self.bias:.4g} at position {self.bias_at}, max |logit change| {self.max_abs:.4g} "
                f"over {self.positions} position(s)")
        if self.missing:
            text += f"; {self.missing} golden position(s) not reached"
        if tol is not None:
            text += f" (tolerance: log-prob {tol.atol}" + (f", bias {tol.mean}" if tol.mean is not None else "") + ")"
        return text


def compare_logits(golden: list[dict], gen, upto: int | None = None, sketch_multiple: float | None = None) -> LogitDiff:
    """Every logit of every shared position against the golden's: every log-prob (a tail token
    rising counts as much as a top-5 one) and the raw vector's mean change (a constant shift,
    which log-probs cannot see). A compact golden (harness/goldens/store.py) compares its top 256
    log-probs exactly and its sketch's buckets divided by ``sketch_multiple`` (``logit_golden/
    sketch``), so that both read as log-prob changes against the same tolerance."""
    reach = len(golden) if upto is None else min(len(golden), upto + 1)
    n = min(reach, len(gen.step_logits))
    worst = LogitDiff(n, missing=max(0, reach - len(gen.step_logits)))
    for pos in range(n):
        if "logits" not in golden[pos]:
            _compare_compact(golden[pos], gen.step_logits[pos].float(), pos, worst, sketch_multiple)
            continue
        want = unpack_logits(golden[pos]["logits"])
        got = gen.step_logits[pos].float()
        if want.shape != got.shape:
            raise HarnessError(f"logit golden has {want.numel()} logits per position, the run {got.numel()}",
                               f"the model's vocabulary changed: record new goldens deliberately ({UPDATE_COMMAND})")
        d = got - want
        lp = (got.log_softmax(-1) - want.log_softmax(-1)).abs()
        i = int(lp.argmax())
        if float(lp[i]) > worst.max_logprob:
            worst.max_logprob, worst.max_at = float(lp[i]), (pos, i)
        if abs(float(d.mean())) > worst.bias:
            worst.bias, worst.bias_at = abs(float(d.mean())), pos
        worst.max_abs = max(worst.max_abs, float(d.abs().max()))
    return worst


def _compare_compact(record: dict, got, pos: int, worst: LogitDiff, sketch_multiple: float | None) -> None:
    import torch

    from harness.goldens.store import sketch

    if int(record.get("vocab", -1)) != got.numel():
        raise HarnessError(f"logit golden has {record.get('vocab')} logits per position, the run {got.numel()}",
                           f"the model's vocabulary changed: record new goldens deliberately ({UPDATE_COMMAND})")
    lp = got.log_softmax(-1)
    ids = torch.tensor(record["head_ids"], dtype=torch.int64)
    head = (lp[ids] - unpack_logits(record["head_logprobs"])).abs()
    i = int(head.argmax())
    if float(head[i]) > worst.max_logprob:
        worst.max_logprob, worst.max_at = float(head[i]), (pos, int(ids[i]))
    if sketch_multiple:
        from harness.goldens.store import sketch_layout

        moved = (sketch(got) - unpack_logits(record["sketch"])).abs() / sketch_multiple
        b = int(moved.argmax())
        if float(moved[b]) > worst.max_logprob:
            index, _, _ = sketch_layout(got.numel())
            members = (index == b).nonzero().flatten()
            # the bucket's member that moved most against the run's own vector is unknown without
            # the golden's: name the bucket and its likeliest member (the run's largest logit there)
            likely = int(members[got[members].argmax()])
            worst.max_logprob, worst.max_at = float(moved[b]), (pos, likely)
            worst.sketch_bucket = b
    bias = abs(float(got.mean()) - float(record["mean"]))
    if bias > worst.bias:
        worst.bias, worst.bias_at = bias, pos
    worst.max_abs = max(worst.max_abs, float(head.max()))


# ---- quantization quality ---------------------------------------------------------------------
def quality(reference_logits, logits) -> dict:
    """llama.cpp's perplexity-tool statistics of a quantized run against the FP32 one over the same
    tokens: KL(fp32 || quantized) per position (mean and max) and how often top-1 agrees."""
    ref = reference_logits.float().log_softmax(-1)
    new = logits.float().log_softmax(-1)
    kl = (ref.exp() * (ref - new)).sum(-1)
    same = (ref.argmax(-1) == new.argmax(-1)).float()
    return {"positions": int(kl.numel()), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "same_top1": float(same.mean())}


# ---- the checks the golden tests run (and the teeth tests inject regressions into) -----------
def provenance_first(message: str, model: str = "fixture", localize=None) -> str:
    """A failing golden names the stack's differences first (when there are any), then, where
    ``localize()`` gives one, the localization line (the first component that moved), then itself."""
    note = stack_note(model=model)
    line = localize() if localize is not None else None
    message = f"Localized: {line}. {message}" if line else message
    return f"{note[0].upper()}{note[1:]}. {message}" if note else message


def check_token_golden(recipe: str, stage: str, prompt: str, gen, tokenizer, runs: dict | None = None,
                       localize=None) -> str | None:
    """None when ``gen`` says what the golden says; else the localized divergence (``localize``: the
    activation goldens' line, harness/goldens/activations.py)."""
    want = golden_ids(recipe, stage, prompt)
    report = check_tokens(want, gen, tokenizer, f"{recipe}:{stage}")
    if report is None:
        return None
    where = f" Localized: {explain(recipe, stage, runs, tokenizer)}" if runs else ""
    return provenance_first(f"{recipe}:{stage} changed its answer to {prompt!r}: {report}.{where}", localize=localize)


def logit_golden_diff(recipe: str, stage: str, prompt: str, gen, held_as: str | None = None, model: str = "fixture"):
    """The logit-golden comparison: (LogitDiff, its Tolerance) over every position the run shares
    with the golden, up to the first token change. ``held_as``: a recipe that owns no goldens, held
    to ``recipe``'s with its own tolerance (``8da4w-fast`` to ``8da4w``'s)."""
    from harness.tolerances import observe, tolerance

    golden = read_json_golden(logit_golden_path(recipe, stage, prompt, model))
    pos = first_divergence(golden_ids(recipe, stage, prompt, model), gen.ids)
    # a checkpoint's quantized recipes are held to their own goldens with 8da4w's benign-move
    # tolerance (8da4w-fast's own is for being held to 8da4w's); its reference to reference-DTYPE's
    own = recipe if model == "fixture" or recipe.startswith("reference-") else "8da4w"
    name = f"logit_golden/{held_as or own}"
    diff = compare_logits(golden, gen, upto=pos, sketch_multiple=tolerance("logit_golden/sketch").atol)
    observe(name, diff.max_logprob, diff.bias)
    return diff, tolerance(name)


def check_logit_golden(recipe: str, stage: str, prompt: str, gen, held_as: str | None = None,
                       model: str = "fixture", localize=None) -> str | None:
    """None when every log-prob of every position the run shares with the golden (up to the first
    token change) and the logits' bias are within ``logit_golden/RECIPE``; else which, where and
    by how much."""
    diff, tol = logit_golden_diff(recipe, stage, prompt, gen, held_as, model)
    if diff.within(tol):
        return None
    label = f"{held_as}:{stage} (held to {recipe}'s golden)" if held_as else f"{recipe}:{stage}"
    return provenance_first(f"{label} logits for {prompt!r} moved: {diff.describe(tol)}", model, localize)


def check_prompt_golden(prompt: str, tokenizer) -> str | None:
    """None when the chat template and tokenizer still turn the prompt into the recorded text and ids."""
    want = read_json_golden(prompt_golden_path(prompt))
    got = prompt_record(prompt, tokenizer)
    if got == want:
        return None
    if got["rendered"] != want["rendered"]:
        what = f"the chat template renders {got['rendered']!r}, golden {want['rendered']!r}"
    else:
        pos = first_divergence(want["ids"], got["ids"])
        what = (f"the tokenizer gives ids {got['ids']} for the same text, golden {want['ids']} "
                f"(first difference at prompt position {pos})")
    return provenance_first(f"tokenize (chat template + tokenizer) changed what the model sees for {prompt!r}: {what}")


def check_quality_golden(recipe: str, record: dict, model: str = "fixture") -> str | None:
    """None when each subset's mean KL from fp32 and same-top-1 rate stay within ``quality/RECIPE``
    of the golden (``atol``: |change| of the mean KL, ``mean``: of the same-top-1 rate)."""
    from harness.tolerances import observe, tolerance

    want = read_json_golden(quality_golden_path(recipe, model))
    name = f"quality/{recipe}"
    tol = tolerance(name)
    bad = []
    for subset in sorted(set(want) | set(record)):
        ref, got = want.get(subset), record.get(subset)
        if ref is None or got is None:
            bad.append(f"{subset} {'is new' if ref is None else 'is missing'}")
            continue
        d_kl, d_top = abs(got["kl_mean"] - ref["kl_mean"]), abs(got["same_top1"] - ref["same_top1"])
        observe(name, d_kl, d_top)
        if d_kl > tol.atol or d_top > tol.mean:
            bad.append(f"over the {subset.replace('_', ' ')}: KL mean {ref['kl_mean']:.4g} -> {got['kl_mean']:.4g}, "
                       f"same-top-1 {ref['same_top1']:.4f} -> {got['same_top1']:.4f}")
    if not bad:
        return None
    return provenance_first(f"{recipe} quantization quality against fp32 moved: " + "; ".join(bad)
                            + f" (tolerance {name}: KL mean {tol.atol}, same-top-1 {tol.mean})", model)


def check_quantize_golden(recipe: str, record: dict, model: str = "fixture") -> str | None:
    """None when every quantized tensor has the golden's codes exactly and its scales within
    ``quantize_golden/scale``; else the first tensors that moved."""
    from harness.tolerances import observe, tolerance

    want = read_json_golden(quantize_golden_path(recipe, model))
    tol = tolerance("quantize_golden/scale")
    bad = []
    for name in sorted(set(want) | set(record)):
        a, b = want.get(name), record.get(name)
        if a is None or b is None:
            bad.append(f"{name} {'is new' if a is None else 'is no longer quantized'}")
            continue
        for key in sorted(k for k in set(a) | set(b) if k != "scale"):
            if a.get(key) != b.get(key):
                bad.append(f"{name} {key.removesuffix('_sha256')} changed")
        if "scale" in a or "scale" in b:
            old, new = unpack_logits(a["scale"]), unpack_logits(b["scale"])
            if old.shape != new.shape:
                bad.append(f"{name} has {new.numel()} scales, golden {old.numel()}")
                continue
            rel = ((new - old).abs() / old.abs().clamp_min(1e-30))
            worst = float(rel.max())
            observe("quantize_golden/scale", worst)
            if worst > tol.atol:
                i = int(rel.argmax())
                bad.append(f"{name} scale[{i}] {float(old[i]):.6g} -> {float(new[i]):.6g} "
                           f"(relative change {worst:.3g} > {tol.atol})")
    if not bad:
        return None
    return provenance_first(f"{recipe}:quantize (torchao's codes and scales) changed in {len(bad)} place(s): "
                            + "; ".join(bad[:4]), model)
