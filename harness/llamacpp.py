"""llama.cpp as an independent implementation: a GGUF (see ``harness/gguf.py``) run through
llama-cpp-python with our own greedy loop.

The prompt goes in as token ids (our tokenizer, chat-templated: ``harness.pipeline.encode_prompt``),
so tokenization is not part of the comparison. Prefill is one ``eval`` of the whole prompt, then one
``eval`` per new token; the next token is the argmax of llama.cpp's raw logits for the last
position (after its final-logit softcapping, exactly as transformers' logits), so ties resolve the
way ``torch.argmax`` resolves them (first index) and no sampler is involved. Timings are
``time.perf_counter`` around those calls.

``llamacpp_agreement`` is the cross-implementation check that ``tests/test_llamacpp.py`` runs and
the golden-refresh gate (``harness/golden_refresh.py``) calls: llama.cpp F32, teacher-forced on
transformers' own ids, against transformers' FP32 logits at every prompt position and every
generated position.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.gguf import capture_llama_log, check_gguf, import_llama_cpp, log_reason

DEFAULT_CTX = 512
SEED = 0
# llama.cpp keeps its KV cache in F16 by default (what it deploys); "f32" makes an F32 GGUF F32
# end to end, for comparing with transformers' FP32 logits without F16 rounding of K and V.
KV_TYPES = {"f16": "GGML_TYPE_F16", "f32": "GGML_TYPE_F32", "q8_0": "GGML_TYPE_Q8_0"}


@dataclass
class LlamaGeneration:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    top: list[tuple[list[int], list[float]]] = field(default_factory=list)  # per position, if top_k
    margins: list[float] = field(default_factory=list)  # top-1 minus top-2 logit per position
    step_logits: list = field(default_factory=list)  # full float32 logits per position, if keep_logits
    stopped_on_eos: bool = False
    timings: dict = field(default_factory=dict)


class LlamaCppRunner:
    """One llama.cpp model (``llama_cpp.Llama``) loaded from a GGUF, CPU only."""

    def __init__(self, gguf_path, n_threads: int | None = None, n_ctx: int = DEFAULT_CTX,
                 n_batch: int | None = None, kv_type: str = "f16", logits_all: bool = False):
        self.path = Path(gguf_path)
        self.info = check_gguf(self.path)  # missing / not GGUF / truncated / bad layout: one line
        llama_cpp = import_llama_cpp()
        self._llama_cpp = llama_cpp
        self.n_threads = int(n_threads or os.cpu_count() or 1)
        self.n_ctx = int(n_ctx)
        if kv_type not in KV_TYPES:
            raise HarnessError(f"unknown KV cache type {kv_type!r}", f"use one of {', '.join(KV_TYPES)}")
        self.kv_type = kv_type
        # logits_all: llama.cpp computes and keeps the logits of every evaluated position
        # (``Llama.scores``), which ``teacher_forced`` reads; otherwise only the last position's.
        self.logits_all = bool(logits_all)
        kv = getattr(llama_cpp, KV_TYPES[kv_type])
        t0 = time.perf_counter()
        with capture_llama_log(llama_cpp) as log:
            try:
                self.llm = llama_cpp.Llama(
                    model_path=str(self.path), n_ctx=self.n_ctx, n_batch=int(n_batch or self.n_ctx),
                    n_ubatch=int(n_batch or self.n_ctx), n_threads=self.n_threads,
                    n_threads_batch=self.n_threads, n_gpu_layers=0, seed=SEED, logits_all=self.logits_all,
                    type_k=kv, type_v=kv, verbose=False,
                )
            except (ValueError, RuntimeError, OSError) as e:
                raise HarnessError(f"llama.cpp could not load {self.path} ({log_reason(log) or e})",
                                   "re-convert the GGUF with this llama-cpp-python (harness.gguf.gguf_for)") from e
        self.load_s = time.perf_counter() - t0
        self.n_vocab = int(self.llm.n_vocab())

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
            self.llm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _last_logits(self):
        import numpy as np

        ptr = self._llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def _eval(self, ids: list[int]):
        try:
            self.llm.eval(ids)
        except RuntimeError as e:
            raise HarnessError(f"llama.cpp failed to evaluate {len(ids)} token(s) at position "
                               f"{self.llm.n_tokens} ({e})", "check the prompt ids and the context size") from e

    def _check_ids(self, prompt_ids, what: str = "prompt") -> list[int]:
        ids = [int(i) for i in prompt_ids]
        if not ids and what == "prompt":
            raise HarnessError("empty prompt", "pass at least one token id (e.g. <bos>)")
        bad = [i for i in ids if not 0 <= i < self.n_vocab]
        if bad:
            raise HarnessError(f"{what} id {bad[0]} is outside the model's vocabulary (0..{self.n_vocab - 1})",
                               "tokenize with the model's own tokenizer")
        return ids

    def teacher_forced(self, prompt_ids: list[int], new_ids: list[int]):
        """llama.cpp's float32 logits at every position of ``prompt_ids`` followed by ``new_ids``
        (another implementation's answer), evaluated as llama.cpp generates: the prompt in one
        ``eval`` (one row per prompt position, ``[n, V]``), then ``new_ids[:-1]`` one per ``eval``.
        Returns ``(prompt_logits [n, V], step_logits)`` where ``step_logits[j]`` is the distribution
        ``new_ids[j]`` was picked from (``step_logits[0]`` is the last prompt row), as
        ``Generation.step_logits``. Needs a runner made with ``logits_all=True``."""
        import numpy as np

        if not self.logits_all:
            raise HarnessError("teacher_forced reads every position's logits, which this runner does not keep",
                               "make the LlamaCppRunner with logits_all=True")
        ids = self._check_ids(prompt_ids)
        new = self._check_ids(new_ids, "new token")
        total = len(ids) + max(len(new) - 1, 0)
        if total > self.n_ctx:
            raise HarnessError(f"prompt ({len(ids)} tokens) + {len(new)} new tokens exceed llama.cpp's context of "
                               f"{self.n_ctx}", "pass a larger n_ctx or fewer tokens")
        self.llm.reset()
        self._eval(ids)
        for tid in new[:-1]:
            self._eval([tid])
        scores = np.array(self.llm.scores[:total], dtype=np.float32, copy=True)
        n = len(ids)
        steps = [scores[n - 1 + j] for j in range(len(new))]
        return scores[:n], steps

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_ids=None, top_k: int = 0,
                 keep_logits: bool = False) -> LlamaGeneration:
        """Greedy ids; with ``top_k`` the top-k (ids, logits) at each generated position (ties in
        id order, like ``torch.topk`` on CPU in practice); timings in ``.timings``."""
        import numpy as np

        ids = self._check_ids(prompt_ids)
        if max_new_tokens < 1:
            raise HarnessError(f"max_new_tokens must be at least 1 (got {max_new_tokens})", "ask for one or more tokens")
        if len(ids) + max_new_tokens > self.n_ctx:
            raise HarnessError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed llama.cpp's "
                               f"context of {self.n_ctx}", "pass a larger n_ctx or fewer tokens")
        eos = frozenset(int(e) for e in (eos_ids or ()))
        gen = LlamaGeneration(prompt_ids=ids)
        self.llm.reset()
        decode_s = 0.0
        t0 = time.perf_counter()
        self._eval(ids)
        logits = self._last_logits()
        nxt = int(np.argmax(logits))
        ttft = time.perf_counter() - t0
        prefill_s = ttft
        for i in range(max_new_tokens):
            gen.ids.append(nxt)
            self._record(gen, logits, top_k, keep_logits)
            if nxt in eos:
                gen.stopped_on_eos = True
                break
            if i == max_new_tokens - 1:
                break
            t1 = time.perf_counter()
            self._eval([nxt])
            logits = self._last_logits()
            nxt = int(np.argmax(logits))
            decode_s += time.perf_counter() - t1
        n_dec = len(gen.ids) - 1
        gen.timings = {
            "load_s": self.load_s,
            "prompt_tokens": len(ids),
            "new_tokens": len(gen.ids),
            "prefill_s": prefill_s,
            "ttft_s": ttft,
            "decode_s": decode_s,
            "prefill_tok_s": len(ids) / prefill_s if prefill_s > 0 else float("nan"),
            "decode_tok_s": n_dec / decode_s if n_dec and decode_s > 0 else float("nan"),
            "threads": self.n_threads,
        }
        return gen

    @staticmethod
    def _record(gen: LlamaGeneration, logits, top_k: int, keep_logits: bool) -> None:
        order = top_ids(logits, max(top_k, 2))
        gen.margins.append(float(logits[order[0]] - logits[order[1]]))
        if top_k:
            top = order[:top_k]
            gen.top.append(([int(i) for i in top], [float(logits[i]) for i in top]))
        if keep_logits:
            gen.step_logits.append(logits)


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

    import_llama_cpp()  # missing or broken llama-cpp-python: a one-line HarnessError with the install command
    logit_atol = tolerance("llamacpp_vs_hf/f32_logits").atol
    tie_tol = tolerance("llamacpp_vs_hf/f32_tie").atol
    agreement = Agreement()
    own = runner is None
    if own:
        from harness.gguf import gguf_for

        runner = LlamaCppRunner(gguf_for(model, "f32"), n_ctx=AGREEMENT_CTX, kv_type="f32", logits_all=True)
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
            from harness.pipeline import shared_model

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
    ``LlamaCppRunner(..., kv_type="f32", logits_all=True)`` on ``model``'s F32 GGUF to reuse."""
    return compare_with_transformers(runs, model, hf_model, runner).problems
