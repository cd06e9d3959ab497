"""Build ExecuTorch's torch-free native runner (``harness/runtimes/cpp/et_native.cpp``): a C++ program
that runs a ``.pte`` the way a device application does, with no Python and no libtorch.

Why: the executorch wheel's Python runtime (``_C.so``) links libtorch_cpu, about 350 MB of
resident memory before any model loads, so a peak-RSS comparison with llama.cpp measured through
it compares libtorch, not the runtimes. The wheel also ships the C++ runtime on its own
(``executorch/lib``: libexecutorch, the XNNPACK delegate, the optimized and quantized kernels,
the thread pool, with headers under ``executorch/include``); none of these link torch. The one
piece it ships only inside a torch-linked library is the LLM custom ops' runtime kernels
(``libcustom_ops_aot_lib.so``), so ``harness/runtimes/cpp/llama_kernels.cpp`` registers its own
``llama::custom_sdpa.out``, ``update_cache.out`` and ``update_cache_with_indices.out``.
``harness/runtimes/cpp/tied_kernels.cpp`` holds the harness's own operator (``harness::q4_linear``,
the tied ``lm_head``): compiled into the runner, and built as a shared library
(:func:`kernel_library`) that the Python runtimes load into ExecuTorch's kernel registry.

The binary is built once per source, compiler and executorch install, into the artifact cache
(atomic, then run once to check that its libraries resolve and its kernels register).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.runtimes.base import Generation, Runtime, check_prompt, register
from harness.runtimes.child import ChildRuntime

SOURCES = ("et_native.cpp", "llama_kernels.cpp", "tied_kernels.cpp")
KERNEL_SOURCES = ("tied_kernels.cpp",)  # the harness's own operators, for the Python runtimes too
# registration-only libraries first, kept by --no-as-needed: nothing references them by symbol
LIBRARIES = ("executorch_kernels_quantized", "executorch_kernels_optimized", "executorch_backend_xnnpack",
             "executorch_threadpool", "executorch")
FLAGS = ("-std=c++17", "-O3", "-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED",
         "-DET_USE_THREADPOOL")


def source_dir() -> Path:
    return Path(__file__).resolve().parent / "cpp"


def executorch_root() -> Path:
    """The installed executorch package (its ``include/`` and ``lib/``)."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError("executorch is not installed", "pip install -e '.[dev]'")
    root = Path(list(spec.submodule_search_locations)[0])
    missing = [p for p in ("include/executorch/runtime", "lib/libexecutorch.so",
                           "lib/libexecutorch_backend_xnnpack.so") if not (root / p).exists()]
    if missing:
        raise HarnessError(f"the executorch package at {root} ships no C++ runtime ({', '.join(missing)} missing)",
                           "install an executorch wheel that carries executorch/lib and executorch/include "
                           "(1.5.1 does), or build ExecuTorch from source")
    return root


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise HarnessError("no C++ compiler found (c++, g++, clang++ or $CXX)",
                           "install one (apt install g++) to build the native runner")
    return cxx


def compile_command(out: Path, cxx: str | None = None, root: Path | None = None, lib: Path | None = None,
                    rpath: str | None = None) -> list[str]:
    """Headers from the installed wheel (``root``); libraries from its ``lib/`` unless ``lib`` names
    others (the aarch64 wheel's: harness/runtimes/arm.py), found at run time through ``rpath``."""
    root = root or executorch_root()
    lib = lib or root / "lib"
    return [cxx or compiler(), *FLAGS, f"-I{root / 'include'}",
            f"-I{root / 'include/executorch/runtime/core/portable_type/c10'}",
            *[str(source_dir() / s) for s in SOURCES], "-o", str(out), f"-L{lib}", "-Wl,--no-as-needed",
            *[f"-l{name}" for name in LIBRARIES], "-Wl,--as-needed", f"-Wl,-rpath,{rpath or lib}", "-lpthread"]


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def sources_digest(names=SOURCES) -> str:
    """sha256 over the C++ sources ``names`` (part of every build key of what they compile into)."""
    h = hashlib.sha256()
    for name in names:
        h.update((source_dir() / name).read_bytes())
    return h.hexdigest()


def compile_or_fail(cmd: list[str], what: str) -> None:
    """Run a compiler command; on failure one line: ``what`` failed, with its first error."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        first = next((l for l in out.stderr.splitlines() if "error" in l), out.stderr.strip()[-300:])
        raise HarnessError(f"{what} failed ({first.strip()})", "run by hand to see all: " + " ".join(cmd))


def build_key() -> str:
    from harness.cache import cache_key

    cxx = compiler()
    return cache_key("native", sources=sources_digest(), command=compile_command(Path("OUT"), cxx),
                     compiler=_compiler_version(cxx))


def verify_binary(path: Path) -> None:
    """Run it without arguments: its libraries must resolve, its kernels register, and it must
    answer with its usage line (exit 2)."""
    out = subprocess.run([str(path)], capture_output=True, text=True, timeout=60)
    if out.returncode != 2 or "usage: et_native" not in out.stderr:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"the native runner {path} does not start (exit {out.returncode}: {last})",
                           "check that executorch's lib/ is intact (pip install --force-reinstall executorch)")


def native_runner() -> Path:
    """The built binary (from the artifact cache when its key matches)."""
    from harness.cache import ArtifactCache

    def build(path: Path) -> dict:
        cmd = compile_command(path)
        compile_or_fail(cmd, "building the native runner")
        verify_binary(path)
        return {"command": cmd}

    return ArtifactCache().get_or_build("native", build_key(), "et_native", build)


def kernel_library_command(out: Path, cxx: str | None = None) -> list[str]:
    root = executorch_root()
    return [cxx or compiler(), *FLAGS, "-fPIC", "-shared", f"-I{root / 'include'}",
            f"-I{root / 'include/executorch/runtime/core/portable_type/c10'}",
            *[str(source_dir() / s) for s in KERNEL_SOURCES], "-o", str(out), f"-L{root / 'lib'}",
            "-lexecutorch_threadpool", "-lexecutorch", f"-Wl,-rpath,{root / 'lib'}", "-lpthread"]


def kernel_library() -> Path:
    """``libharness_kernels.so``: the harness's own operators' ExecuTorch kernels, for a process
    whose runtime is the executorch wheel's (loading it registers them; harness/oplib.py). Built
    once per source, compiler and executorch install, into the artifact cache."""
    from harness.cache import ArtifactCache, cache_key

    cxx = compiler()
    key = cache_key("kernels", sources=sources_digest(KERNEL_SOURCES),
                    command=kernel_library_command(Path("OUT"), cxx), compiler=_compiler_version(cxx))

    def build(path: Path) -> dict:
        cmd = kernel_library_command(path, cxx)
        compile_or_fail(cmd, "building the harness's kernel library")
        # it must load (its libraries resolve, its kernels register) in a process of its own
        check = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(path)!r})"],
                               capture_output=True, text=True, timeout=120)
        if check.returncode != 0:
            last = (check.stderr.strip().splitlines() or ["no output"])[-1]
            raise HarnessError(f"the kernel library {path} does not load ({last})",
                               "check that executorch's lib/ is intact (pip install --force-reinstall executorch)")
        return {"command": cmd}

    return ArtifactCache().get_or_build("kernels", key, "libharness_kernels.so", build)


def linked_libraries(path: Path) -> list[str]:
    """The shared libraries the dynamic linker resolves for ``path`` (``ldd``)."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=60)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def native_command(artifact, threads: int, args: list[str], runner: list[str] | None = None) -> list[str]:
    """``runner``: how to start the program (default: this host's build); e.g. the aarch64 build
    behind qemu's prefix (harness/runtimes/arm.py)."""
    return [*(runner or [str(native_runner())]), str(artifact), str(threads), *args]


def prompt_logits(artifact, ids: list[int], threads: int = 2, runner: list[str] | None = None,
                  timeout: float = 600) -> list:
    """Every position's logits for a prefill of ``ids`` (``--logits``), as nested lists ``[1][s][V]``
    (no torch needed: the device's pi5 tier compares them too)."""
    import json

    cmd = native_command(artifact, threads, ["--logits", json.dumps([int(i) for i in ids])], runner)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"the native runner took over {timeout:.0f} s for {len(ids)} positions' logits",
                           "run by hand: " + " ".join(cmd)) from e
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"the native runner failed on {artifact} (exit {out.returncode}: {last})",
                           "run by hand: " + " ".join(cmd))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    flat, (batch, seq, vocab) = got["logits"], got["shape"]
    return [[flat[(b * seq + k) * vocab:(b * seq + k + 1) * vocab] for k in range(seq)] for b in range(batch)]


@register
class NativeRuntime(ChildRuntime, Runtime):
    """The ``.pte`` through the native runner, a program of its own driven over its stdin/stdout
    (``--serve``): it owns its greedy loop (C++) and times it; it runs a fixed number of tokens,
    cut here after the first EOS."""

    kind = "executorch-native"
    logits_fix = "use prompt_logits() for a prompt's logits"

    def __init__(self, artifact, threads: int | None = None, timeout: float = 900, runner: list[str] | None = None):
        self.artifact, self.threads = artifact, int(threads or os.cpu_count() or 1)
        self._start(native_command(artifact, self.threads, ["--serve"], runner), f"{self.kind} on {artifact}", timeout)

    def generate(self, prompt_ids, max_new_tokens: int, eos_ids=frozenset(), keep_prefill_logits: bool = False,
                 keep_logits: bool = False) -> Generation:
        self._no_logits(keep_prefill_logits, keep_logits)
        ids = check_prompt(prompt_ids, max_new_tokens, None, None)
        s = self._child.ask({"prompt": ids, "new_tokens": int(max_new_tokens)})["sample"]
        gen = Generation(prompt_ids=ids, ids=list(s["ids"]), ttft_s=s["ttft_s"], decode_s=s["decode_s"])
        return gen.cut_at_eos(frozenset(int(e) for e in eos_ids)) if eos_ids else gen
