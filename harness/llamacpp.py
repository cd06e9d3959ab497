"""llama.cpp as an independent implementation: a GGUF (see ``harness/gguf.py``) run through
llama-cpp-python with our own greedy loop.

The prompt goes in as token ids (our tokenizer, chat-templated: ``harness.pipeline.encode_prompt``),
so tokenization is not part of the comparison. Prefill is one ``eval`` of the whole prompt, then one
``eval`` per new token; the next token is the argmax of llama.cpp's raw logits for the last
position (after its final-logit softcapping, exactly as transformers' logits), so ties resolve the
way ``torch.argmax`` resolves them (first index) and no sampler is involved. Timings are
``time.perf_counter`` around those calls.
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
                 n_batch: int | None = None, kv_type: str = "f16"):
        self.path = Path(gguf_path)
        self.info = check_gguf(self.path)  # missing / not GGUF / truncated / bad layout: one line
        llama_cpp = import_llama_cpp()
        self._llama_cpp = llama_cpp
        self.n_threads = int(n_threads or os.cpu_count() or 1)
        self.n_ctx = int(n_ctx)
        if kv_type not in KV_TYPES:
            raise HarnessError(f"unknown KV cache type {kv_type!r}", f"use one of {', '.join(KV_TYPES)}")
        self.kv_type = kv_type
        kv = getattr(llama_cpp, KV_TYPES[kv_type])
        t0 = time.perf_counter()
        with capture_llama_log(llama_cpp) as log:
            try:
                self.llm = llama_cpp.Llama(
                    model_path=str(self.path), n_ctx=self.n_ctx, n_batch=int(n_batch or self.n_ctx),
                    n_ubatch=int(n_batch or self.n_ctx), n_threads=self.n_threads,
                    n_threads_batch=self.n_threads, n_gpu_layers=0, seed=SEED, logits_all=False,
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

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_ids=None, top_k: int = 0,
                 keep_logits: bool = False) -> LlamaGeneration:
        """Greedy ids; with ``top_k`` the top-k (ids, logits) at each generated position (ties in
        id order, like ``torch.topk`` on CPU in practice); timings in ``.timings``."""
        import numpy as np

        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise HarnessError("empty prompt", "pass at least one token id (e.g. <bos>)")
        bad = [i for i in ids if not 0 <= i < self.n_vocab]
        if bad:
            raise HarnessError(f"prompt id {bad[0]} is outside the model's vocabulary (0..{self.n_vocab - 1})",
                               "tokenize with the model's own tokenizer")
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
        import numpy as np

        k = max(top_k, 2)
        part = np.argpartition(-logits, k - 1)[:k]
        order = part[np.lexsort((part, -logits[part]))]  # by logit, ties by id
        gen.margins.append(float(logits[order[0]] - logits[order[1]]))
        if top_k:
            top = order[:top_k]
            gen.top.append(([int(i) for i in top], [float(logits[i]) for i in top]))
        if keep_logits:
            gen.step_logits.append(logits)
