"""The benchmark protocol (from the deployment log): each prompt generated greedily, a fixed number
of new tokens, timed as prefill (the whole prompt in one call), time to first token, and decode
(one token per call); medians over prompts × rounds, warm-up excluded.

A *runtime* is one way to run one model: ``eager:fp32`` (transformers in PyTorch, through the same
wrapper that is exported), ``executorch:RECIPE`` (a ``.pte`` through ExecuTorch's Python runtime),
``executorch-native:RECIPE`` (the same ``.pte`` through ExecuTorch's C++ runtime in a program with no
Python and no libtorch, ``harness.native``), ``llama.cpp:f32|q4_0`` (a GGUF through
llama-cpp-python). Every runtime runs with the same number
of threads, each timed in a process of its own (``IsolatedRunner``), and load time and peak RSS
come from one more fresh process (``python -m harness.benchworker``), so one runtime's threads,
caches and memory never count against another's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from harness.errors import HarnessError

DEFAULT_PROMPTS = 5
DEFAULT_PROMPT_TOKENS = 32
DEFAULT_NEW_TOKENS = 64
DEFAULT_ROUNDS = 3
NATIVE = "executorch-native"


@dataclass
class Sample:
    """One prompt, generated once."""

    prompt_tokens: int
    new_tokens: int
    ttft_s: float  # prefill call + choosing the first token
    decode_s: float  # the remaining new_tokens - 1 single-token calls
    ids: list[int] = field(default_factory=list)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s

    @property
    def decode_tok_s(self) -> float:
        return (self.new_tokens - 1) / self.decode_s if self.new_tokens > 1 else float("nan")


def bench_prompts(n: int = DEFAULT_PROMPTS, length: int = DEFAULT_PROMPT_TOKENS, vocab: int = 8192,
                  bos: int = 2, seed: int = 0) -> list[list[int]]:
    """``n`` seeded random prompts of ``length`` ids (``<bos>`` first) for the random-weight model."""
    import random

    rng = random.Random(seed)
    return [[bos] + [rng.randrange(6, vocab) for _ in range(length - 1)] for _ in range(n)]


def timed_greedy(step: Callable, prompt_ids: list[int], new_tokens: int) -> Sample:
    """Greedy over a ``step(ids[1,s], cache_position[s]) -> logits[1,s,V]`` function, a fixed
    number of tokens (no EOS stop: every runtime does the same work)."""
    import torch

    n = len(prompt_ids)
    with torch.no_grad():
        t0 = time.perf_counter()
        logits = step(torch.tensor([prompt_ids], dtype=torch.long), torch.arange(n, dtype=torch.long))
        nxt = int(logits[0, -1].argmax())
        t1 = time.perf_counter()
        ids = [nxt]
        for pos in range(n, n + new_tokens - 1):
            logits = step(torch.tensor([[nxt]], dtype=torch.long), torch.tensor([pos], dtype=torch.long))
            nxt = int(logits[0, -1].argmax())
            ids.append(nxt)
        t2 = time.perf_counter()
    return Sample(n, new_tokens, t1 - t0, t2 - t1, ids)


def set_threads(runtime: str, threads: int) -> None:
    kind = runtime.split(":")[0]
    if kind in ("eager", "executorch"):
        import torch

        torch.set_num_threads(threads)
    if kind == "executorch":
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(threads)


class Runner:
    """A loaded runtime: ``generate(prompt_ids, new_tokens) -> Sample``."""

    def __init__(self, runtime: str, artifact: str, threads: int):
        self.runtime, self.artifact, self.threads = runtime, artifact, threads
        kind, _, recipe = runtime.partition(":")
        set_threads(runtime, threads)
        t0 = time.perf_counter()
        if kind == "eager":
            from harness.export import ExportSettings, make_wrapper
            from harness.load import load_model

            model = load_model(artifact).model
            wrapper = make_wrapper(model, ExportSettings())
            self._step = lambda ids, pos: wrapper(input_ids=ids, cache_position=pos)
            self.generate = lambda ids, n: timed_greedy(self._step, ids, n)
        elif kind == "executorch":
            from harness.pte import PteRunner

            self._step = PteRunner(artifact).step
            self.generate = lambda ids, n: timed_greedy(self._step, ids, n)
        elif kind == "llama.cpp":
            from harness.llamacpp import LlamaCppRunner

            llm = LlamaCppRunner(artifact, n_threads=threads)

            def generate(ids, n):
                out = llm.generate(ids, n)
                t = out.timings
                return Sample(len(ids), len(out.ids), t["ttft_s"], t["decode_s"], list(out.ids))

            self.generate = generate
        elif kind == NATIVE:
            raise HarnessError(f"{runtime} is a C++ program, not something to load into Python",
                               "drive it with IsolatedRunner (its own process)")
        else:
            raise HarnessError(f"unknown runtime {runtime!r}",
                               f"use eager:fp32, executorch:RECIPE, {NATIVE}:RECIPE or llama.cpp:f32|q4_0")
        self.load_s = time.perf_counter() - t0


def medians(samples: list[Sample]) -> dict:
    return {
        "prefill_tok_s": statistics.median(s.prefill_tok_s for s in samples),
        "decode_tok_s": statistics.median(s.decode_tok_s for s in samples),
        "ttft_s": statistics.median(s.ttft_s for s in samples),
        "samples": len(samples),
    }


# ---- the child process that measures load time and memory -------------------------------------
def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: Linux carries that across
    fork+exec, so a child spawned by a big pytest process would report its parent's peak."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux; macOS: bytes


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / (1 << 20)


def measure_in_child(runtime: str, artifact: str, threads: int, prompt: list[int], new_tokens: int,
                     timeout: float = 900) -> dict:
    """Load time, RSS before loading (interpreter + libraries), peak RSS after one generation."""
    if runtime.partition(":")[0] == NATIVE:
        return _run_native(artifact, threads, ["--once", json.dumps(prompt), str(new_tokens)],
                           f"{runtime}: measuring load time and memory", timeout)
    return run_worker([runtime, artifact, str(threads), json.dumps(prompt), str(new_tokens)],
                      f"{runtime}: measuring load time and memory", timeout=timeout)


def run_worker(args: list[str], what: str, stdin: str | None = None, timeout: float = 900) -> dict:
    """``python -m harness.benchworker ARGS`` in a fresh process: its last stdout line as JSON, or
    one line naming ``what`` failed and the child's last error line."""
    return _run_json([sys.executable, "-m", "harness.benchworker", *args], what, stdin, timeout)


def native_command(artifact: str, threads: int, args: list[str]) -> list[str]:
    from harness.native import native_runner

    return [str(native_runner()), str(artifact), str(threads), *args]


def _run_native(artifact: str, threads: int, args: list[str], what: str, timeout: float) -> dict:
    return _run_json(native_command(artifact, threads, args), what, None, timeout)


def _run_json(cmd: list[str], what: str, stdin: str | None, timeout: float) -> dict:
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=_child_env())
    if out.returncode != 0:
        last = next((l for l in reversed(out.stderr.strip().splitlines()) if l.strip()), "no output")
        raise HarnessError(f"{what} failed ({last.strip()})", "run the same command by hand: " + " ".join(cmd[:5]) + " ...")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([_repo_root(), os.environ.get("PYTHONPATH", "")]))


class IsolatedRunner:
    """A runtime loaded and timed in a process of its own (``python -m harness.benchworker
    --serve``, or the native runner's ``--serve``), driven one prompt at a time over its stdin/stdout: the same interface as
    ``Runner``; the timings are taken in the child, around the runtime's own calls.

    Why not in the pytest process: whatever one runtime leaves behind there slows the next (after
    the 8da4w-fast ``.pte`` had run in the process, llama.cpp Q4_0 decoded at 60-80 tok/s instead
    of 255-310 on an idle machine), and a user runs one runtime per process anyway."""

    def __init__(self, runtime: str, artifact: str, threads: int, timeout: float = 900):
        self.runtime, self.artifact, self.threads, self.timeout = runtime, artifact, threads, timeout
        if runtime.partition(":")[0] == NATIVE:
            cmd = native_command(artifact, threads, ["--serve"])
        else:
            cmd = [sys.executable, "-m", "harness.benchworker", "--serve", runtime, artifact, str(threads)]
        self._cmd = cmd
        # stderr to a file, not a pipe: a child that logs more than a pipe holds (ExecuTorch logs
        # to stderr) would block on a pipe nobody reads until it fails
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      text=True, bufsize=1, env=_child_env())
        self.pid = self._proc.pid
        self.returncode = None
        hello = self._reply()
        self.load_s = hello["load_s"]

    def _reply(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(timeout=self.timeout)
            self.returncode = self._proc.returncode
            self._stderr.seek(0)
            err = self._stderr.read().strip().splitlines()
            last = next((l for l in reversed(err) if l.strip()), "no output")
            raise HarnessError(f"{self.runtime} on {self.artifact}: its process ended "
                               f"(exit {self.returncode}: {last.strip()})",
                               "run it by hand: " + " ".join(self._cmd))
        return json.loads(line)

    def generate(self, prompt_ids: list[int], new_tokens: int) -> Sample:
        self._proc.stdin.write(json.dumps({"prompt": [int(i) for i in prompt_ids], "new_tokens": int(new_tokens)}) + "\n")
        self._proc.stdin.flush()
        return Sample(**self._reply()["sample"])

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self.returncode = self._proc.returncode
        self._proc.stdout.close()
        self._stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()


def serve_main(argv: list[str]) -> int:
    """The child of ``IsolatedRunner``: load, say so, then one JSON line in, one Sample out."""
    runtime, artifact, threads = argv
    try:
        runner = Runner(runtime, artifact, int(threads))
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"load_s": runner.load_s}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sample = runner.generate(request["prompt"], request["new_tokens"])
        print(json.dumps({"sample": asdict(sample)}), flush=True)
    return 0


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_main(argv: list[str]) -> int:
    runtime, artifact, threads, prompt, new_tokens = argv
    kind = runtime.split(":")[0]
    # import the runtime's libraries first, so "base" is the interpreter + libraries, no model
    if kind in ("eager", "executorch"):
        import torch  # noqa: F401
    if kind == "executorch":
        import executorch.kernels.quantized  # noqa: F401
        from executorch.runtime import Runtime  # noqa: F401
    if kind == "llama.cpp":
        import llama_cpp  # noqa: F401
    base = rss_mb()
    runner = Runner(runtime, artifact, int(threads))
    sample = runner.generate(json.loads(prompt), int(new_tokens))
    print(json.dumps({"load_s": runner.load_s, "base_rss_mb": base, "peak_rss_mb": peak_rss_mb(),
                      "model_rss_mb": peak_rss_mb() - base, "sample": asdict(sample)}))
    return 0
