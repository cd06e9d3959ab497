"""Running a runtime in a process of its own: a transport that wraps any runtime.

``ProcessRuntime(kind, artifact, threads=...)`` starts ``python -m harness.runtimes.process serve``,
which opens the runtime there (harness.runtimes.base.open_runtime) and answers one JSON line per
``generate``; the timings are taken in the child, by the same greedy loop the goldens check. The
native runner is itself a program: its runtime speaks the same line protocol (``--serve``), so
``isolated(kind, ...)`` gives a process for every kind.

Why not in the caller's process: whatever one runtime leaves behind there slows the next (after
the 8da4w-fast ``.pte`` had run in the process, llama.cpp Q4_0 decoded at 60-80 tok/s instead of
255-310 on an idle machine), and a user runs one runtime per process anyway.

``measure_once`` is the same in a fresh process that loads, generates once and reports its load
time, its resident set before loading (interpreter + libraries) and its peak.
"""

from __future__ import annotations

import json
import os
import sys

from harness.errors import HarnessError
from harness.rss import peak_rss_mb, rss_mb
from harness.runtimes.base import Generation, Runtime
from harness.runtimes.child import ChildRuntime, run_json


class ProcessRuntime(ChildRuntime, Runtime):
    """Any registered runtime, in a ``python -m harness.runtimes.process serve`` child."""

    def __init__(self, kind: str, artifact, threads: int = 1, timeout: float = 900):
        self.kind, self.artifact, self.threads = kind, artifact, threads
        self._start([sys.executable, "-m", "harness.runtimes.process", "serve", kind, str(artifact), str(threads)],
                    f"{kind} on {artifact}", timeout)

    def generate(self, prompt_ids, max_new_tokens: int, eos_ids=frozenset(), keep_prefill_logits: bool = False,
                 keep_logits: bool = False) -> Generation:
        self._no_logits(keep_prefill_logits, keep_logits)
        reply = self._child.ask({"prompt": [int(i) for i in prompt_ids], "new_tokens": int(max_new_tokens),
                                 "eos_ids": sorted(int(e) for e in eos_ids)})
        if "error" in reply:
            raise HarnessError(f"{self.kind} on {self.artifact}: {reply['error']}", reply.get("fix", "see the message"))
        return Generation(**reply["generation"])


def isolated(kind: str, artifact, threads: int = 1, timeout: float = 900, runner: list[str] | None = None) -> Runtime:
    """``kind`` on ``artifact`` in a process of its own (the native runner is one already;
    ``runner``: how to start it, e.g. a bundle's aarch64 build behind qemu)."""
    if kind == "executorch-native":
        from harness.runtimes.native import NativeRuntime

        return NativeRuntime(artifact, threads=threads, timeout=timeout, runner=runner)
    return ProcessRuntime(kind, artifact, threads, timeout)


def measure_once(kind: str, artifact, threads: int, prompt: list[int], new_tokens: int, timeout: float = 900,
                 runner: list[str] | None = None) -> dict:
    """Load time, RSS before loading (interpreter + libraries), peak RSS after one generation, in
    a fresh process: ``{"load_s", "base_rss_mb", "peak_rss_mb", "model_rss_mb", "generation"}``."""
    what = f"{kind}: measuring load time and memory"
    if kind == "executorch-native":
        from harness.runtimes.native import native_command

        out = run_json(native_command(artifact, threads, ["--once", json.dumps(prompt), str(new_tokens)], runner),
                       what, timeout=timeout)
        sample = out.pop("sample")
        out["generation"] = {"prompt_ids": list(prompt), "ids": sample["ids"], "ttft_s": sample["ttft_s"],
                             "decode_s": sample["decode_s"]}
        return out
    return run_json([sys.executable, "-m", "harness.runtimes.process", "once", kind, str(artifact), str(threads),
                     json.dumps(prompt), str(new_tokens)], what, timeout=timeout)


# ---- the child ----------------------------------------------------------------------------------
_LIBRARIES = {"eager": ("torch",), "exported": ("torch",), "executorch": ("torch", "executorch.kernels.quantized",
              "executorch.runtime"), "llama.cpp": ("llama_cpp",)}


def _serve(kind: str, artifact: str, threads: str) -> int:
    from harness.runtimes.base import open_runtime

    try:
        runtime = open_runtime(kind, artifact, threads=int(threads))
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"load_s": runtime.load_s}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            gen = runtime.generate(request["prompt"], request["new_tokens"], eos_ids=request.get("eos_ids", ()),
                                   keep_logits=False)
        except HarnessError as e:
            print(json.dumps({"error": e.problem, "fix": e.fix}), flush=True)
            continue
        print(json.dumps({"generation": gen.timing()}), flush=True)
    runtime.close()
    return 0


def _once(kind: str, artifact: str, threads: str, prompt: str, new_tokens: str) -> int:
    import importlib

    from harness.runtimes.base import open_runtime

    for lib in _LIBRARIES.get(kind, ()):  # the libraries first: "base" is interpreter + libraries, no model
        importlib.import_module(lib)
    base = rss_mb()
    runtime = open_runtime(kind, artifact, threads=int(threads))
    gen = runtime.generate(json.loads(prompt), int(new_tokens), keep_logits=False)
    peak = peak_rss_mb()
    print(json.dumps({"load_s": runtime.load_s, "base_rss_mb": base, "peak_rss_mb": peak,
                      "model_rss_mb": peak - base, "generation": gen.timing()}))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 4:
        return _serve(*argv[1:])
    if argv[:1] == ["once"] and len(argv) == 6:
        return _once(*argv[1:])
    print("usage: python -m harness.runtimes.process serve KIND ARTIFACT THREADS | "
          "once KIND ARTIFACT THREADS PROMPT_JSON NEW_TOKENS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    sys.exit(main(sys.argv[1:]))
