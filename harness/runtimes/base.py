"""The one runtime interface, the one greedy loop and the one result type.

A *runtime* is one way of running one model: ``eager`` (transformers in PyTorch, through the
wrapper that gets exported), ``exported`` (the reloaded ``.pt2``), ``executorch`` (a ``.pte``
through ExecuTorch's Python runtime), ``llm-runner`` (ExecuTorch's C++ ``TextLLMRunner``),
``executorch-native`` (the ``.pte`` through ExecuTorch's C++ runtime in a program with no Python
and no libtorch) and ``llama.cpp`` (a GGUF through llama-cpp-python). Each is a ``Runtime``
subclass registered under its kind; ``open_runtime(kind, artifact, ...)`` makes one, and
``harness.runtimes.process.ProcessRuntime`` runs any of them in a process of its own.

``step(ids, positions) -> logits[1, s, V]`` is the exported program's contract
(harness/program.py); ``generate(prompt_ids, n, eos_ids) -> Generation`` is, unless a runtime owns
its loop (the native runner, ``TextLLMRunner``), ``greedy`` over ``step``: prefill in one call,
then one token per call at ``cache_position = [p]``; stop after an EOS id (kept in the output, as
``model.generate`` does) or after ``n`` tokens. The loop is timed (time to first token, decode),
so the benchmark times exactly the code the goldens check. It needs no torch: ids go in as
lists, and logits come back as whatever the runtime gives (torch tensor or numpy array), which
is what lets the Pi tier run on a device without torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from harness.errors import HarnessError


@dataclass
class Generation:
    """One greedy generation, from any runtime."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    step_logits: list = field(default_factory=list)  # [V] per generated token, where the runtime gives them
    prefill_logits: object = None  # [n, V]: every prompt position, when asked for
    cache_positions: list[int] = field(default_factory=list)  # position of each call's first token
    stopped_on_eos: bool = False
    ttft_s: float | None = None  # the prefill call + choosing the first token
    decode_s: float | None = None  # the remaining single-token calls
    pieces: list[str] = field(default_factory=list)  # text pieces, from a runtime that gives text
    stats: dict = field(default_factory=dict)  # the runtime's own figures (TextLLMRunner's stats)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def new_tokens(self) -> int:
        return len(self.ids)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s else float("nan")

    @property
    def decode_tok_s(self) -> float:
        return (self.new_tokens - 1) / self.decode_s if self.new_tokens > 1 and self.decode_s else float("nan")

    def timing(self) -> dict:
        """The figures without the logits (what crosses a process boundary)."""
        return {"prompt_ids": list(self.prompt_ids), "ids": list(self.ids), "stopped_on_eos": self.stopped_on_eos,
                "ttft_s": self.ttft_s, "decode_s": self.decode_s, "cache_positions": list(self.cache_positions)}

    def cut_at_eos(self, eos_ids) -> "Generation":
        """Keep the ids up to and including the first EOS (a loop that ran a fixed count)."""
        for i, t in enumerate(self.ids):
            if t in eos_ids:
                self.ids = self.ids[: i + 1]
                self.step_logits = self.step_logits[: i + 1]
                self.cache_positions = self.cache_positions[: i + 1]
                self.stopped_on_eos = True
                break
        return self


StepFn = Callable[[list, list], object]


def _copy(row):
    return row.clone() if hasattr(row, "clone") else row.copy()


def check_prompt(prompt_ids, max_new_tokens: int, max_context: int | None, vocab_size: int | None,
                 max_call: int | None = None, context_name: str = "the exported maximum context") -> list[int]:
    """The harness's own guard before any runtime sees a prompt: non-empty, ids in the vocabulary,
    at most ``max_call`` ids in the prefill call (an exported program's: ``max_context - 1``), and
    room for it and ``max_new_tokens - 1`` fed tokens (the last new token is never fed)."""
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise HarnessError("empty prompt", "pass a non-empty prompt")
    if max_new_tokens < 1:
        raise HarnessError(f"max_new_tokens must be at least 1 (got {max_new_tokens})", "ask for one or more tokens")
    if vocab_size is not None:
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise HarnessError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})",
                               "encode the prompt with the model's own tokenizer")
    if max_context is not None:
        max_call = max_context - 1 if max_call is None else max_call
        if len(ids) > max_call:
            raise HarnessError(f"{len(ids)} tokens in one call exceed the exported maximum of {max_call} per call "
                               f"(context {max_context})", "shorten the prompt, or re-export with a larger max_context")
        if len(ids) + max_new_tokens - 1 > max_context:
            raise HarnessError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed {context_name} "
                               f"of {max_context}", "shorten the prompt or lower --max-new-tokens")
    return ids


def greedy(step: StepFn, prompt_ids, max_new_tokens: int, eos_ids=frozenset(), max_context: int | None = None,
           vocab_size: int | None = None, keep_prefill_logits: bool = False, keep_logits: bool = True,
           max_call: int | None = None, context_name: str = "the exported maximum context") -> Generation:
    """The one greedy loop (see the module docstring). ``eos_ids`` empty: exactly
    ``max_new_tokens`` (what the benchmark protocol wants: every runtime does the same work)."""
    ids = check_prompt(prompt_ids, max_new_tokens, max_context, vocab_size, max_call, context_name)
    n = len(ids)
    eos = frozenset(int(e) for e in eos_ids)
    gen = Generation(prompt_ids=ids)
    t0 = time.perf_counter()
    logits = step(ids, list(range(n)))
    gen.cache_positions.append(0)
    nxt = int(logits[0, -1].argmax())
    gen.ttft_s = time.perf_counter() - t0
    if keep_prefill_logits:
        gen.prefill_logits = _copy(logits[0])
    t1 = time.perf_counter()
    pos = n
    for i in range(max_new_tokens):
        gen.ids.append(nxt)
        if keep_logits:
            gen.step_logits.append(_copy(logits[0, -1]))
        if nxt in eos:
            gen.stopped_on_eos = True
            break
        if i == max_new_tokens - 1:
            break
        logits = step([nxt], [pos])
        gen.cache_positions.append(pos)
        nxt = int(logits[0, -1].argmax())
        pos += 1
    gen.decode_s = time.perf_counter() - t1
    return gen


class Runtime:
    """One loaded model in one runtime. Subclasses set ``kind`` and implement ``step`` (or, with
    ``owns_loop``, ``generate``); ``max_context``/``vocab_size`` bound what ``generate`` accepts."""

    kind: ClassVar[str] = ""
    owns_loop: ClassVar[bool] = False  # generate() is the runtime's own loop; no step()
    max_context: int | None = None
    max_call: int | None = None  # the longest call; None: max_context - 1 (an exported program's)
    context_name: str = "the exported maximum context"
    vocab_size: int | None = None
    load_s: float = 0.0
    artifact: object = None

    def step(self, ids, positions):
        raise HarnessError(f"the {self.kind} runtime runs its own decoding loop and gives no logits per call",
                           "call generate(), or use the executorch runtime for logits")

    def metadata(self) -> dict:
        return {}

    def close(self) -> None:
        pass

    def generate(self, prompt_ids, max_new_tokens: int, eos_ids=frozenset(), keep_prefill_logits: bool = False,
                 keep_logits: bool = True) -> Generation:
        return greedy(self.step, prompt_ids, max_new_tokens, eos_ids, self.max_context, self.vocab_size,
                      keep_prefill_logits, keep_logits, self.max_call, self.context_name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- the registry -----------------------------------------------------------------------------------
# kind -> the module that defines it, imported only when that kind is opened (llama.cpp's runtime
# must not need torch, the torch runtimes must not need llama-cpp-python).
MODULES = {
    "eager": "harness.runtimes.pytorch",
    "exported": "harness.runtimes.pytorch",
    "executorch": "harness.runtimes.executorch",
    "llm-runner": "harness.runtimes.llm_runner",
    "executorch-native": "harness.runtimes.native",
    "llama.cpp": "harness.runtimes.llamacpp",
}
REGISTRY: dict[str, type[Runtime]] = {}


def register(cls: type[Runtime]) -> type[Runtime]:
    if MODULES.get(cls.kind) != cls.__module__:
        raise HarnessError(f"runtime kind {cls.kind!r} is not declared for {cls.__module__}",
                           "add it to harness.runtimes.base.MODULES")
    REGISTRY[cls.kind] = cls
    return cls


def runtime_class(kind: str) -> type[Runtime]:
    if kind not in MODULES:
        raise HarnessError(f"unknown runtime {kind!r}", f"use one of {', '.join(MODULES)}")
    if kind not in REGISTRY:
        import importlib

        importlib.import_module(MODULES[kind])
    return REGISTRY[kind]


def open_runtime(kind: str, artifact, **options) -> Runtime:
    """A loaded runtime of ``kind`` on ``artifact`` (a model spec, a ``.pt2``, a ``.pte``, a GGUF);
    ``options`` go to its constructor (``threads``, ...)."""
    return runtime_class(kind)(artifact, **options)


@dataclass(frozen=True)
class RuntimeSpec:
    """A runtime and the recipe (or GGUF type) of its artifact, e.g. ``executorch`` + ``8da4w``;
    ``label`` (``executorch:8da4w``) names it in tables and the benchmark JSON."""

    kind: str
    recipe: str

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.recipe}"

    def __iter__(self):  # kind, recipe = RuntimeSpec.parse(label)
        return iter((self.kind, self.recipe))

    @classmethod
    def parse(cls, text: str) -> "RuntimeSpec":
        kind, sep, recipe = str(text).partition(":")
        if not sep or not recipe:
            raise HarnessError(f"runtime {text!r} is not KIND:RECIPE", f"e.g. executorch:8da4w (kinds: {', '.join(MODULES)})")
        if kind not in MODULES:
            runtime_class(kind)  # the one-line error naming the kinds
        return cls(kind, recipe)
