"""The one comparator: two sides' logits, held to a named entry of harness/tolerances.py, with a
message that names both sides, the position, the token and the margin when it fails.

``compare_tensors`` compares two logit tensors (``[V]``, ``[s, V]`` or ``[1, s, V]``; torch or numpy);
``compare_runs`` compares two ``Generation``s of the same prompt: every logit of every shared
position, up to the first token where they part, which must be a near-tie of the reference.
Each observes what it measured under the tolerance's name (``HARNESS_TOLERANCE_REPORT``), which is
how the tolerances' measured values are kept honest.
"""

from __future__ import annotations


def _excess(name: str, reference, got):
    """(worst |diff|, |mean diff|, flat index of the worst, reference value, got value, vocab) for
    two tensors, observed under ``name``; None when within the tolerance."""
    from harness.tolerances import observe, tolerance

    tol = tolerance(name)
    try:
        import torch
    except ImportError:  # the device's pi5 tier: nested lists, no torch
        torch = None
    if torch is not None:
        a, b = torch.as_tensor(reference).float(), torch.as_tensor(got).float()
        if a.shape != b.shape:
            return "shape", tuple(a.shape), tuple(b.shape)
        d = b - a
        worst, bias = float(d.abs().max()), abs(float(d.mean()))
        flat_a, flat_b, vocab = a.flatten(), b.flatten(), int(a.shape[-1])
        worst_at = lambda: int(d.abs().flatten().argmax())  # noqa: E731
    else:
        (sa, flat_a), (sb, flat_b) = _flat(reference), _flat(got)
        if sa != sb:
            return "shape", sa, sb
        d = [y - x for x, y in zip(flat_a, flat_b)]
        worst = max((abs(v) for v in d), default=0.0)
        worst = float("nan") if any(v != v for v in d) else worst
        bias, vocab = abs(sum(d) / max(len(d), 1)), sa[-1]
        worst_at = lambda: max(range(len(d)), key=lambda k: abs(d[k]) if d[k] == d[k] else float("inf"))  # noqa: E731
    observe(name, worst, bias if tol.mean is not None else None)
    if worst > tol.atol or (tol.mean is not None and bias > tol.mean) or worst != worst:
        i = worst_at()
        return worst, bias, i, float(flat_a[i]), float(flat_b[i]), vocab
    return None


def _flat(x) -> tuple[tuple[int, ...], list[float]]:
    """A nested list's shape and its values in row-major order."""
    shape, level = [], x
    while isinstance(level, (list, tuple)):
        shape.append(len(level))
        level = level[0] if level else None
    flat = x
    for _ in shape[1:]:
        flat = [v for row in flat for v in row]
    return tuple(shape), [float(v) for v in flat]


def _say(name: str, ref_label: str, got_label: str, where: str, found) -> str:
    from harness.tolerances import tolerance

    tol = tolerance(name)
    if found[0] == "shape":
        return f"{got_label} vs {ref_label}{where}: shape {found[2]} where {ref_label} has {found[1]}"
    worst, bias, i, ref, got, vocab = found
    row, token = divmod(i, vocab)
    at = f" at position {row}" if not where else f" (row {row})" if row else ""
    return (f"{got_label} vs {ref_label}{where}{at}: max |logit diff| {worst:.4g} at token {token} "
            f"({got_label} {got:.6g}, {ref_label} {ref:.6g}), bias (mean diff) {bias:.4g}; tolerance {name} "
            f"max {tol.atol}" + (f", bias {tol.mean}" if tol.mean is not None else "") + f" ({tol.reason[:120]}...)")


def compare_tensors(reference, got, tolerance_name: str, ref_label: str, got_label: str, where: str = "") -> str | None:
    """None when every element of ``got`` is within the tolerance of ``reference`` (and, where the
    tolerance has one, the bias too); else one line naming both sides, where, the token and both
    values there, and the tolerance."""
    found = _excess(tolerance_name, reference, got)
    return None if found is None else _say(tolerance_name, ref_label, got_label, where and f" at {where}", found)


def compare_runs(reference, run, tolerance_name: str, ref_label: str, run_label: str) -> str | None:
    """None when ``run`` is within the tolerance of ``reference``: max |logit difference| and
    (where the tolerance has one) the bias, |mean difference| over the vocabulary, at each position up
    to the first token where they part, and the same tokens wherever the reference's top-2 margin
    exceeds twice the tolerance (a near-tie may flip)."""
    from harness.goldens.checks import first_divergence
    from harness.tolerances import tolerance

    tol = tolerance(tolerance_name)
    if reference.prefill_logits is not None and run.prefill_logits is not None:
        for pos, (a, b) in enumerate(zip(reference.prefill_logits, run.prefill_logits)):
            if (found := _excess(tolerance_name, a, b)) is not None:
                return _say(tolerance_name, ref_label, run_label, f" at prompt position {pos}", found)
    split = first_divergence(reference.ids, run.ids)
    n = min(len(reference.step_logits), len(run.step_logits))
    if split is not None:
        n = min(n, split + 1)
    for pos in range(n):
        if (found := _excess(tolerance_name, reference.step_logits[pos], run.step_logits[pos])) is not None:
            return _say(tolerance_name, ref_label, run_label, f" at generated position {pos}", found)
    if split is not None:
        top = reference.step_logits[split].float().topk(2).values if split < len(reference.step_logits) else None
        margin = float(top[0] - top[1]) if top is not None else None
        if margin is None or margin > 2 * tol.atol:
            return (f"{run_label} parts from {ref_label} at generated position {split}: "
                    f"{run.ids[split] if split < len(run.ids) else None} vs "
                    f"{reference.ids[split] if split < len(reference.ids) else None} where {ref_label}'s top-2 "
                    f"margin is {margin if margin is None else round(margin, 4)} (> 2 x {tol.atol}: not a near-tie)")
    return None
