"""llama.cpp as an independent implementation: a GGUF (see ``harness/runtimes/gguf.py``) run through
llama-cpp-python with our own greedy loop.

The prompt goes in as token ids (our tokenizer, chat-templated: ``harness.pipeline.encode_prompt``),
so tokenization is not part of the comparison. Prefill is one ``eval`` of the whole prompt, then one
``eval`` per new token; the next token is the argmax of llama.cpp's raw logits for the last
position (after its final-logit softcapping, exactly as transformers' logits), so ties resolve the
way ``torch.argmax`` resolves them (first index) and no sampler is involved. Timings are
``time.perf_counter`` around those calls.

The cross-implementation check built on it is harness/goldens/agreement.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from harness.errors import HarnessError
from harness.runtimes.base import Runtime, register
from harness.runtimes.gguf import check_gguf
from harness.runtimes.llamacpp_setup import capture_llama_log, import_llama_cpp, log_reason

DEFAULT_CTX = 512
SEED = 0
# llama.cpp keeps its KV cache in F16 by default (what it deploys); "f32" makes an F32 GGUF F32
# end to end, for comparing with transformers' FP32 logits without F16 rounding of K and V.
KV_TYPES = {"f16": "GGML_TYPE_F16", "f32": "GGML_TYPE_F32", "q8_0": "GGML_TYPE_Q8_0"}


@register
class LlamaCppRuntime(Runtime):
    """One llama.cpp model (``llama_cpp.Llama``) loaded from a GGUF, CPU only; ``generate`` is the
    harness's greedy loop over ``step``."""

    kind = "llama.cpp"
    context_name = "llama.cpp's context"

    def __init__(self, artifact, threads: int | None = None, n_ctx: int = DEFAULT_CTX,
                 n_batch: int | None = None, kv_type: str = "f16", logits_all: bool = False):
        self.path = self.artifact = Path(artifact)
        self.info = check_gguf(self.path)  # missing / not GGUF / truncated / bad layout: one line
        llama_cpp = import_llama_cpp()
        self._llama_cpp = llama_cpp
        self.n_threads = int(threads or os.cpu_count() or 1)
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
                                   "re-convert the GGUF with this llama-cpp-python (harness.runtimes.gguf.gguf_for)") from e
        self.load_s = time.perf_counter() - t0
        self.n_vocab = int(self.llm.n_vocab())
        self.max_context, self.max_call, self.vocab_size = self.n_ctx, self.n_ctx, self.n_vocab

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
                               "open the llama.cpp runtime with logits_all=True")
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

    def step(self, ids, positions):
        """``logits[1, s, V]`` (numpy) for ``ids`` at ``positions``, which must continue what was
        fed (llama.cpp's own cache) or start again at 0; only the last row unless ``logits_all``."""
        import numpy as np

        ids = self._check_ids(ids)
        start = int(positions[0])
        if start == 0:
            self.llm.reset()
        elif start != self.llm.n_tokens:
            raise HarnessError(f"llama.cpp holds {self.llm.n_tokens} positions, asked to continue at {start}",
                               "feed positions in order, starting at 0")
        self._eval(ids)
        if self.logits_all:
            return np.array(self.llm.scores[start:start + len(ids)], dtype=np.float32, copy=True)[None]
        return self._last_logits()[None, None]
