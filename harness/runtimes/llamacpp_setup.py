"""The installed llama-cpp-python and llama.cpp's converter: importing the binding (or saying in one
line why not, and whether that fails the run), fetching ``convert_hf_to_gguf.py`` with its
``conversion/`` package and ``gguf-py`` from the sdist of the *installed* version (which vendors the
llama.cpp it was built from) into the artifact cache once, and routing llama.cpp's log into error
messages."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from harness.cache import cache_root
from harness.errors import HarnessError

DIST = "llama-cpp-python"
PINNED_VERSION = "0.3.36"  # the dev extra's pin (pyproject.toml)
INSTALL_HINT = (f"pip install -e '.[dev]' (or: pip install {DIST}=={PINNED_VERSION}; it builds llama.cpp, ~8 min; "
                f"on an Intel AMX host with CMAKE_ARGS=-DCMAKE_PROJECT_INCLUDE=$PWD/cmake/llamacpp-no-amx.cmake)")
# What the converter needs from the sdist's vendor/llama.cpp/: the script, the per-architecture
# ``conversion`` package it imports, ``gguf-py`` (put on sys.path by the script itself), the chat
# templates some converters read, and the licence.
CONVERTER_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/templates/", "LICENSE")
SDIST_PREFIX = "vendor/llama.cpp/"
_COMPLETE = ".complete"  # written last inside the temp dir, before the rename


# ---- the installed llama-cpp-python and its converter ---------------------------------------------
def llama_cpp_version() -> str:
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        raise HarnessError(f"{DIST} is not installed", INSTALL_HINT) from None


NO_AMX_CMAKE = "cmake/llamacpp-no-amx.cmake"  # tox.ini passes it to llama-cpp-python's build
REBUILD_HINT = (f"rebuild it without them (pip's wheel cache would hand the same build back): pip cache remove "
                f"llama_cpp_python, then tox -r -e mac (tox.ini passes {NO_AMX_CMAKE}), or outside tox "
                f"CMAKE_ARGS=-DCMAKE_PROJECT_INCLUDE=$PWD/{NO_AMX_CMAKE} pip install --no-cache-dir --force-reinstall "
                f"--no-deps {DIST}=={PINNED_VERSION}; or set HARNESS_LLAMACPP_AMX=1 to run its AMX kernels anyway")


def import_llama_cpp():
    """``llama_cpp``, or a one-line error saying how to install it (or rebuild it: ``amx_problem``)."""
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError) as e:  # OSError/RuntimeError: its shared library did not load
        raise HarnessError(_import_problem(e), INSTALL_HINT) from e
    if (problem := amx_problem(_system_info(llama_cpp))) is not None:
        raise HarnessError(problem, REBUILD_HINT)
    return llama_cpp


def _system_info(llama_cpp) -> str:
    """llama.cpp's own "CPU : AVX2 = 1 | ..." line ("" where the binding does not say)."""
    info = getattr(llama_cpp, "llama_print_system_info", lambda: b"")() or b""
    return info.decode(errors="replace") if isinstance(info, bytes) else str(info)


def amx_problem(system_info: str, env=None) -> str | None:
    """Why this llama.cpp build must not run here (None when it may): one built with its AMX kernels
    (``AMX_INT8 = 1`` in its system info, as ``-march=native`` gives on Intel Sapphire Rapids and
    later) repacks Q4_0 weights for AMX and segfaults on the first decode, taking the whole test
    process with it (measured on 2026-12-05 on such a host, 1 and 2 threads; ggml-org/llama.cpp#20824
    and #26954). ``HARNESS_LLAMACPP_AMX=1`` lets it run where those kernels are known to work."""
    env = os.environ if env is None else env
    if "AMX_INT8 = 1" not in system_info or env.get("HARNESS_LLAMACPP_AMX") == "1":
        return None
    return (f"this {DIST} was built with llama.cpp's AMX kernels (system info: AMX_INT8 = 1), which segfault "
            f"on the first Q4_0 decode on Intel AMX hosts")


def _import_problem(e: BaseException) -> str:
    why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return f"llama_cpp (the {DIST} binding) cannot be imported ({why})"


def llama_cpp_import_problem() -> str | None:
    """None when ``llama_cpp`` imports and may run; otherwise why not and what to do, in one line."""
    try:
        import_llama_cpp()
    except HarnessError as e:
        return str(e)
    return None


def missing_llama_cpp_verdict(problem: str | None, env=None) -> tuple[str, str] | None:
    """What a test run does when llama-cpp-python cannot be used (``problem`` from
    ``llama_cpp_import_problem``: missing, not importable, or a build it refuses, each with its fix):
    nothing (None) when it imports; ``("fail", reason)`` when the environment variable CI is set and
    non-empty, since CI must run the cross-implementation check; ``("skip", problem)`` elsewhere.
    ``reason`` is one line: what is wrong and what to do."""
    if problem is None:
        return None
    env = os.environ if env is None else env
    if str(env.get("CI") or "").strip():
        return "fail", f"{problem} (CI is set, so the llama.cpp cross-check may not be skipped)"
    return "skip", problem


def fetch_command(version: str, dest: str = "DIR") -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
            "--disable-pip-version-check", "-d", dest, f"{DIST}=={version}"]


def _converter_complete(root: Path) -> bool:
    return ((root / _COMPLETE).is_file() and (root / "convert_hf_to_gguf.py").is_file()
            and (root / "conversion" / "__init__.py").is_file()
            and (root / "gguf-py" / "gguf" / "__init__.py").is_file())


def converter_dir(version: str | None = None, root: Path | None = None, progress=None) -> Path:
    """llama.cpp's converter for the installed llama-cpp-python, extracted from its sdist into the
    artifact cache on first use. ``HARNESS_LLAMA_CPP_SDIST`` may point at an already downloaded
    sdist (``llama_cpp_python-<version>.tar.gz``) instead of fetching it with pip."""
    version = version or llama_cpp_version()
    root = Path(root) if root else cache_root()
    target = root / f"llama.cpp-{version}"
    if _converter_complete(target):
        return target
    progress = progress or (lambda msg: None)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".llama.cpp-{version}.download.", dir=root) as dl:
        local = os.environ.get("HARNESS_LLAMA_CPP_SDIST")
        if local:
            sdist = Path(local).expanduser()
            if not sdist.is_file():
                raise HarnessError(f"HARNESS_LLAMA_CPP_SDIST={local} is not a file",
                                   f"point it at llama_cpp_python-{version}.tar.gz, or unset it to fetch with pip")
        else:
            progress(f"fetching llama.cpp's converter ({DIST}=={version} sdist) with pip ...")
            sdist = _download_sdist(version, Path(dl))
        staging = Path(tempfile.mkdtemp(prefix=f".llama.cpp-{version}.", dir=root))
        try:
            _extract_converter(sdist, staging, version)
            (staging / _COMPLETE).write_text(json.dumps({"sdist": sdist.name, "version": version}) + "\n")
            if target.exists():  # an incomplete leftover (or a concurrent writer finished first)
                if _converter_complete(target):
                    return target
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(staging, target)  # atomic: a reader sees the whole tree or none
            except OSError:
                if not _converter_complete(target):
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _download_sdist(version: str, dest: Path) -> Path:
    cmd = fetch_command(version, str(dest))
    shown = " ".join(fetch_command(version, "DIR")[1:])
    fix = (f"check that pip can reach the package index, or run `python {shown}` yourself and set "
           f"HARNESS_LLAMA_CPP_SDIST=DIR/llama_cpp_python-{version}.tar.gz")
    try:
        out = _run_pip(cmd)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"downloading the {DIST}=={version} sdist timed out after 900 s", fix) from None
    found = sorted(dest.glob("*.tar.gz"))
    if out.returncode != 0 or not found:
        last = (out.stderr.strip().splitlines() or out.stdout.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"could not download the {DIST}=={version} sdist for llama.cpp's converter "
                           f"(pip: {last.strip()[:200]})", fix)
    return found[0]


def _run_pip(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def _extract_converter(sdist: Path, dest: Path, version: str) -> None:
    try:
        with tarfile.open(sdist, "r:*") as tar:
            picked = []
            for member in tar.getmembers():
                parts = member.name.split("/", 1)
                if len(parts) < 2 or not parts[1].startswith(SDIST_PREFIX):
                    continue
                rel = parts[1][len(SDIST_PREFIX):]
                if not any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in CONVERTER_MEMBERS):
                    continue
                if not (member.isfile() or member.isdir()):
                    continue
                member.name = rel
                picked.append(member)
            if not any(m.name == "convert_hf_to_gguf.py" for m in picked):
                raise HarnessError(f"{sdist.name} has no {SDIST_PREFIX}convert_hf_to_gguf.py",
                                   f"use the {DIST}=={version} sdist from PyPI")
            tar.extractall(dest, members=picked, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise HarnessError(f"{sdist} is not a readable sdist ({e})",
                           f"delete it and fetch it again: python {' '.join(fetch_command(version)[1:])}") from e


@lru_cache(maxsize=None)
def gguf_py():
    """The ``gguf`` package vendored with the installed llama.cpp (reader, constants)."""
    path = str(converter_dir() / "gguf-py")
    if path not in sys.path:
        sys.path.insert(0, path)
    loaded = sys.modules.get("gguf")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(path):
        for name in [n for n in sys.modules if n == "gguf" or n.startswith("gguf.")]:
            del sys.modules[name]
    import gguf

    return gguf


@contextlib.contextmanager
def capture_llama_log(llama_cpp):
    """Route llama.cpp's log into a list for the duration (for error messages); restore after."""
    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def collect(level, text, user_data):
        try:
            lines.append(text.decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 - never raise across the C boundary
            pass

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def log_reason(lines: list[str]) -> str:
    """The most specific line of a llama.cpp log: the first 'error' line (llama.cpp nests the
    cause as 'error loading model: ...: <cause>'), else the last 'failed'/'invalid' line."""
    text = [l.strip() for l in "".join(lines).splitlines() if l.strip()]
    errors = [l for l in text if "error" in l.lower()]
    if errors:
        return errors[0][:240]
    other = [l for l in text if any(w in l.lower() for w in ("failed", "invalid", "unknown"))]
    return (other[-1] if other else (text[-1] if text else "no log"))[:240]
