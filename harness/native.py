"""Build ExecuTorch's torch-free native runner (``harness/native/et_native.cpp``): a C++ program
that runs a ``.pte`` the way a device application does, with no Python and no libtorch.

Why: the executorch wheel's Python runtime (``_C.so``) links libtorch_cpu, about 350 MB of
resident memory before any model loads, so a peak-RSS comparison with llama.cpp measured through
it compares libtorch, not the runtimes. The wheel also ships the C++ runtime on its own
(``executorch/lib``: libexecutorch, the XNNPACK delegate, the optimized and quantized kernels,
the thread pool, with headers under ``executorch/include``); none of these link torch. The one
piece it ships only inside a torch-linked library is the LLM custom ops' runtime kernels
(``libcustom_ops_aot_lib.so``), so ``harness/native/llama_kernels.cpp`` registers its own
``llama::custom_sdpa.out``, ``update_cache.out`` and ``update_cache_with_indices.out``.

The binary is built once per source, compiler and executorch install, into the artifact cache
(atomic, then run once to check that its libraries resolve and its kernels register).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from harness.errors import HarnessError

SOURCES = ("et_native.cpp", "llama_kernels.cpp")
# registration-only libraries first, kept by --no-as-needed: nothing references them by symbol
LIBRARIES = ("executorch_kernels_quantized", "executorch_kernels_optimized", "executorch_backend_xnnpack",
             "executorch_threadpool", "executorch")
FLAGS = ("-std=c++17", "-O3", "-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED",
         "-DET_USE_THREADPOOL")


def source_dir() -> Path:
    return Path(__file__).resolve().parent / "native"


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


def compile_command(out: Path, cxx: str | None = None, root: Path | None = None) -> list[str]:
    root = root or executorch_root()
    lib = root / "lib"
    return [cxx or compiler(), *FLAGS, f"-I{root / 'include'}",
            f"-I{root / 'include/executorch/runtime/core/portable_type/c10'}",
            *[str(source_dir() / s) for s in SOURCES], "-o", str(out), f"-L{lib}", "-Wl,--no-as-needed",
            *[f"-l{name}" for name in LIBRARIES], "-Wl,--as-needed", f"-Wl,-rpath,{lib}", "-lpthread"]


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def build_key() -> str:
    from harness.cache import cache_key

    h = hashlib.sha256()
    for name in SOURCES:
        h.update((source_dir() / name).read_bytes())
    cxx = compiler()
    return cache_key("native", sources=h.hexdigest(), command=compile_command(Path("OUT"), cxx),
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
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            first = next((l for l in out.stderr.splitlines() if "error" in l), out.stderr.strip()[-300:])
            raise HarnessError(f"building the native runner failed ({first.strip()})",
                               "run by hand to see all: " + " ".join(cmd))
        verify_binary(path)
        return {"command": cmd}

    return ArtifactCache().get_or_build("native", build_key(), "et_native", build)


def linked_libraries(path: Path) -> list[str]:
    """The shared libraries the dynamic linker resolves for ``path`` (``ldd``)."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=60)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
