"""One comparator for two runs of the same prompt: every logit of every shared position, held to a
named entry of harness/tolerances.py, and a message that names both sides, the position and the
margin when it fails."""

from __future__ import annotations

from harness.goldens import first_divergence


def compare_runs(reference, run, tolerance_name: str, ref_label: str, run_label: str) -> str | None:
    """None when ``run`` is within the tolerance of ``reference``: max |logit difference| and
    (where the tolerance has one) the bias, |mean difference| over the vocabulary, at each position up
    to the first token where they part, and the same tokens wherever the reference's top-2 margin
    exceeds twice the tolerance (a near-tie may flip)."""
    from harness.tolerances import observe, tolerance

    tol = tolerance(tolerance_name)

    def exceeds(a, b) -> tuple[float, float, int] | None:
        d = b.float() - a.float()
        worst, bias = float(d.abs().max()), abs(float(d.mean()))
        observe(tolerance_name, worst, bias)
        if worst > tol.atol or (tol.mean is not None and bias > tol.mean):
            return worst, bias, int(d.abs().argmax())
        return None

    def say(where: str, found) -> str:
        worst, bias, token = found
        return (f"{run_label} vs {ref_label} at {where}: max |logit diff| {worst:.4g} (token {token}), "
                f"bias (mean diff) {bias:.4g}; tolerance {tolerance_name} max {tol.atol}"
                + (f", bias {tol.mean}" if tol.mean is not None else "") + f" ({tol.reason[:120]}...)")

    if reference.prefill_logits is not None and run.prefill_logits is not None:
        for pos, (a, b) in enumerate(zip(reference.prefill_logits, run.prefill_logits)):
            if (found := exceeds(a, b)) is not None:
                return say(f"prompt position {pos}", found)
    split = first_divergence(reference.ids, run.ids)
    n = min(len(reference.step_logits), len(run.step_logits))
    if split is not None:
        n = min(n, split + 1)
    for pos in range(n):
        if (found := exceeds(reference.step_logits[pos], run.step_logits[pos])) is not None:
            return say(f"generated position {pos}", found)
    if split is not None:
        top = reference.step_logits[split].float().topk(2).values if split < len(reference.step_logits) else None
        margin = float(top[0] - top[1]) if top is not None else None
        if margin is None or margin > 2 * tol.atol:
            return (f"{run_label} parts from {ref_label} at generated position {split}: "
                    f"{run.ids[split] if split < len(run.ids) else None} vs "
                    f"{reference.ids[split] if split < len(reference.ids) else None} where {ref_label}'s top-2 "
                    f"margin is {margin if margin is None else round(margin, 4)} (> 2 x {tol.atol}: not a near-tie)")
    return None
