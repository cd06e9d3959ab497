"""llama.cpp F32 against transformers FP32: the cross-implementation check that
``tests/test_llamacpp.py`` runs and the golden-refresh gate (harness/goldens/refresh.py) calls.
llama.cpp (harness/runtimes/llamacpp.py), teacher-forced on transformers' own ids, against
transformers' FP32 logits at every prompt position and every generated position."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.runtimes.llamacpp_setup import import_llama_cpp
from harness.runtimes.llamacpp import LlamaCppRuntime


def top_ids(logits, k: int):
    """The ``k`` largest of a numpy logit vector, by logit, ties by id (numpy int array)."""
    import numpy as np

    part = np.argpartition(-logits, k - 1)[:k]
    return part[np.lexsort((part, -logits[part]))]


# ---- llama.cpp F32 against transformers FP32: the cross-implementation check ----------------------
TOP_K = 5
AGREEMENT_CTX = 256  # the fixture's prompts and answers fit with room to spare


@dataclass
class Agreement:
    """What ``compare_with_transformers`` found: one line per disagreement, and the largest
    differences seen, per kind of position ("prompt", "generated"), for calibration."""

    problems: list[str] = field(default_factory=list)
    positions: dict = field(default_factory=lambda: {"prompt": 0, "generated": 0})
    # max |llama.cpp - transformers| over every logit of every position, and where (prompt, position, id)
    max_abs: dict = field(default_factory=lambda: {"prompt": (0.0, None), "generated": (0.0, None)})
    # the largest change llama.cpp makes to the gap between two ids of either top-6 (what can swap them)
    max_gap_change: dict = field(default_factory=lambda: {"prompt": (0.0, None), "generated": (0.0, None)})


def transformers_prompt_logits(hf_model, prompt_ids: list[int]):
    """transformers' FP32 logits at every prompt position: one forward over the ids, ``[n, V]``."""
    import torch

    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([list(prompt_ids)], dtype=torch.long)).logits[0].float()


def _as_numpy(logits):
    import numpy as np

    if hasattr(logits, "detach"):  # a torch tensor
        logits = logits.detach().float().cpu().numpy()
    return np.asarray(logits, dtype=np.float32)


def position_problems(where: str, ll, hf, logit_atol: float, tie_tol: float) -> list[str]:
    """llama.cpp's logit vector ``ll`` against transformers' ``hf`` (numpy or torch) at one position:
    each rank of llama.cpp's top-5 whose id is not transformers' id there, unless the two are a
    near-tie (within ``tie_tol``) in transformers' own logits; and the largest |difference| over the
    whole vector if it exceeds ``logit_atol``. One line each, prefixed with ``where``."""
    import numpy as np

    ll, hf = _as_numpy(ll), _as_numpy(hf)
    if ll.shape != hf.shape:
        return [f"{where}: llama.cpp has {ll.shape[-1]} logits, transformers {hf.shape[-1]}"]
    ll_top = top_ids(ll, TOP_K)
    hf_top = top_ids(hf, TOP_K + 1)
    tail_gap = float(hf[hf_top[TOP_K - 1]] - hf[hf_top[TOP_K]])
    out = []
    for r in range(TOP_K):
        a, b = int(ll_top[r]), int(hf_top[r])
        if a != b:
            gap = abs(float(hf[a]) - float(hf[b]))
            if gap > tie_tol:
                out.append(
                    f"{where}, rank {r + 1}: llama.cpp has id {a} (logit {ll[a]:.5f}; transformers gives it "
                    f"{hf[a]:.5f}), transformers has id {b} (logit {hf[b]:.5f}); transformers' gap between them "
                    f"{gap:.5f} > tie tolerance {tie_tol} (transformers' 5th-6th gap {tail_gap:.5f}; llama.cpp "
                    f"top-5 {ll_top.tolist()}, transformers {hf_top[:TOP_K].tolist()})")
    d = np.abs(ll - hf)
    i = int(d.argmax())
    if float(d[i]) > logit_atol:
        out.append(f"{where}, id {i}: llama.cpp logit {ll[i]:.5f}, transformers {hf[i]:.5f} (|diff| {d[i]:.5f} > "
                   f"{logit_atol}, the largest of the {d.size} logits there)")
    return out


def _gap_change(ll, hf_np) -> float:
    """How much llama.cpp moves the gap between any two ids of either top-(K+1): the spread of
    their differences."""
    import numpy as np

    ids = np.union1d(top_ids(ll, TOP_K + 1), top_ids(hf_np, TOP_K + 1))
    d = ll[ids] - hf_np[ids]
    return float(d.max() - d.min())


def compare_with_transformers(runs: dict, model="fixture", hf_model=None, runner=None) -> Agreement:
    """``llamacpp_agreement`` with the measurements: see there."""
    from harness.tolerances import tolerance

    import_llama_cpp()  # missing, broken or refused (AMX) llama-cpp-python: a one-line HarnessError with its fix
    logit_atol = tolerance("llamacpp_vs_hf/f32_logits").atol
    tie_tol = tolerance("llamacpp_vs_hf/f32_tie").atol
    agreement = Agreement()
    own = runner is None
    if own:
        from harness.runtimes.gguf import gguf_for

        runner = LlamaCppRuntime(gguf_for(model, "f32"), n_ctx=AGREEMENT_CTX, kv_type="f32", logits_all=True)
    try:
        for prompt, gen in runs.items():
            _compare_one(agreement, prompt, gen, model, hf_model, runner, logit_atol, tie_tol)
    finally:
        if own:
            runner.close()
    return agreement


def _compare_one(agreement: Agreement, prompt: str, gen, model, hf_model, runner, logit_atol, tie_tol) -> None:
    import numpy as np

    ids, new = list(gen.prompt_ids), list(gen.ids)
    label = f"llama.cpp F32 vs transformers on {prompt!r}"
    if len(gen.step_logits) != len(new):
        agreement.problems.append(f"{label}: transformers' run has {len(gen.step_logits)} step logits for "
                                  f"{len(new)} generated ids; record the run with its logits (output_logits)")
        return
    hf_prompt = gen.prefill_logits
    if hf_prompt is None:
        if hf_model is None:
            from harness.export.pipeline import shared_model

            hf_model = shared_model(str(model)).model
        hf_prompt = transformers_prompt_logits(hf_model, ids)
    if len(hf_prompt) != len(ids):
        agreement.problems.append(f"{label}: transformers' prompt logits have {len(hf_prompt)} rows for "
                                  f"{len(ids)} prompt ids")
        return
    ll_prompt, ll_steps = runner.teacher_forced(ids, new)
    rows = [("prompt", f"prompt position {p} of {len(ids)}", ll_prompt[p], hf_prompt[p]) for p in range(len(ids))]
    rows += [("generated", f"generated position {j} (id {new[j]})", ll_steps[j], gen.step_logits[j])
             for j in range(len(new))]
    for kind, where, ll, hf in rows:
        agreement.positions[kind] += 1
        hf_np = _as_numpy(hf)
        if ll.shape == hf_np.shape:
            d = np.abs(ll - hf_np)
            i = int(d.argmax())
            if float(d[i]) > agreement.max_abs[kind][0]:
                agreement.max_abs[kind] = (float(d[i]), (prompt, where, i))
            g = _gap_change(ll, hf_np)
            if g > agreement.max_gap_change[kind][0]:
                agreement.max_gap_change[kind] = (g, (prompt, where))
        agreement.problems += [f"{label}, {p}" for p in position_problems(where, ll, hf_np, logit_atol, tie_tol)]


def llamacpp_agreement(runs: dict, model="fixture", hf_model=None, runner=None) -> list[str]:
    """The cross-implementation check, shared by ``tests/test_llamacpp.py`` and the golden-refresh
    gate. ``runs`` maps each prompt to transformers' FP32 greedy ``Generation`` for it (the new
    fp32 ``hf_generate`` golden: ``prompt_ids``, ``ids``, ``step_logits``; ``prefill_logits``
    [n, V] if already computed, else transformers' FP32 forward over the prompt ids here, with
    ``hf_model`` or ``model``'s FP32 weights). llama.cpp F32 (F32 KV cache) is teacher-forced on
    the same ids, and at every prompt position and every generated position its top-5 ids must
    equal transformers' (an order difference only at a near-tie, ``llamacpp_vs_hf/f32_tie``) and
    every logit must be within ``llamacpp_vs_hf/f32_logits`` of transformers'.

    Returns one line per disagreement: empty when llama.cpp agrees everywhere. A missing
    llama-cpp-python raises a one-line HarnessError saying how to install it. ``runner``: an open
    ``LlamaCppRuntime(..., kv_type="f32", logits_all=True)`` on ``model``'s F32 GGUF to reuse."""
    return compare_with_transformers(runs, model, hf_model, runner).problems
