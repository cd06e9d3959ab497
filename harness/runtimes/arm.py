"""The native runner for the Pi 5 (aarch64, Cortex-A76), cross-compiled here, and its emulation;
and the same self-contained runner directory for this host (``device_runner("x86_64")``).

The aarch64 executorch wheel ships the same C++ runtime libraries as the x86_64 one (in
``executorch/lib``; the include trees are identical), none linking libtorch or libpython, all
needing at most glibc 2.27. So the native runner's sources (harness/runtimes/cpp) cross-compile
unchanged with Debian's ``aarch64-linux-gnu-g++`` against those libraries, with the host wheel's
headers. The result is a directory: ``et_native`` and ``lib/`` beside it (rpath ``$ORIGIN/lib``),
which runs on the device as it is, or here under qemu-user:

    qemu-aarch64-static -L /usr/aarch64-linux-gnu -cpu cortex-a76 DIR/et_native PTE THREADS ...

On ``cortex-a76`` (the Pi 5's features: asimd, fp16, rdm, dotprod; no i8mm, SVE or SME) XNNPACK
picks its ``sdot`` kernels (KleidiAI's ``*_neon_dotprod``), as on the device; ``cortex-a72`` takes the
NEON path without dot-product. Rates measured under emulation say nothing about the device.

The wheel is fetched once from PyPI (``pip download``) into the artifact cache and checked against
its pinned sha256; ``HARNESS_AARCH64_WHEEL=FILE`` names a copy instead (offline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from harness.errors import HarnessError

WHEEL_VERSION = "1.5.1"  # the executorch the harness pins
WHEEL_NAME = f"executorch-{WHEEL_VERSION}-cp311-cp311-manylinux_2_28_aarch64.whl"
WHEEL_SHA256 = "8ee02348a3ea80ddf770822911ebf78da616b73afce0fbaaa79f23311c88c66a"  # PyPI, 17,810,491 bytes
WHEEL_ENV = "HARNESS_AARCH64_WHEEL"
CROSS_CXX = "aarch64-linux-gnu-g++"
QEMU = ("qemu-aarch64-static", "qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's aarch64 glibc (libc6-arm64-cross), for qemu's -L
EM_AARCH64 = 183
ELF_MACHINE = {"aarch64": EM_AARCH64, "x86_64": 62}
APT = "apt-get install g++-aarch64-linux-gnu qemu-user-static"


def cross_compiler() -> str:
    cxx = os.environ.get("HARNESS_CROSS_CXX") or shutil.which(CROSS_CXX)
    if not cxx:
        raise HarnessError(f"no aarch64 cross compiler ({CROSS_CXX}) on PATH", f"install it: {APT}")
    return cxx


def qemu(name: str | None = None) -> str:
    """qemu-user for aarch64: ``name`` (a path or a program on PATH), else the first of QEMU found."""
    for candidate in ([name] if name else QEMU):
        found = shutil.which(candidate)
        if found:
            return found
    raise HarnessError(f"no qemu-user for aarch64 ({name or ' or '.join(QEMU)}) found", f"install it: {APT}")


def emulator(cpu: str, qemu_name: str | None = None) -> list[str]:
    """The command prefix that runs an aarch64 binary here as ``cpu`` (binfmt is not assumed)."""
    if not SYSROOT.is_dir():
        raise HarnessError(f"no aarch64 C library at {SYSROOT}", f"install it: {APT}")
    return [qemu(qemu_name), "-L", str(SYSROOT), "-cpu", cpu]


def wheel() -> Path:
    """The aarch64 executorch wheel, checked against its pinned sha256."""
    from harness.cache import ArtifactCache, sha256_file

    given = os.environ.get(WHEEL_ENV)
    if given:
        path = Path(given)
        if not path.is_file() or sha256_file(path) != WHEEL_SHA256:
            raise HarnessError(f"{WHEEL_ENV}={given} is not {WHEEL_NAME} (missing, or its sha256 differs)",
                               f"download it: pip download --platform manylinux_2_28_aarch64 --python-version 3.11 "
                               f"--only-binary=:all: --no-deps executorch=={WHEEL_VERSION}")
        return path

    def fetch(path: Path) -> dict:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--platform", "manylinux_2_28_aarch64", "--python-version", "3.11",
               f"executorch=={WHEEL_VERSION}", "-d", str(path.parent)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        got = path.parent / WHEEL_NAME
        if out.returncode != 0 or not got.is_file():
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise HarnessError(f"could not download {WHEEL_NAME} ({last.strip()[:160]})",
                               f"download it elsewhere and set {WHEEL_ENV}=FILE")
        if sha256_file(got) != WHEEL_SHA256:
            raise HarnessError(f"the downloaded {WHEEL_NAME} does not match its pinned sha256",
                               "PyPI served other bytes: check the index, or set HARNESS_AARCH64_WHEEL")
        got.replace(path)
        return {"source": "pip download", "sha256": WHEEL_SHA256}

    return ArtifactCache().get_or_build("wheel-aarch64", WHEEL_SHA256[:16], WHEEL_NAME, fetch)


def runtime_libraries(whl: Path, out: Path) -> list[str]:
    """Extract the wheel's C++ runtime (``executorch/lib/*.so*``) into ``out``; their names."""
    out.mkdir(parents=True, exist_ok=True)
    names = []
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if len(parts) == 3 and parts[:2] == ["executorch", "lib"] and ".so" in parts[2]:
                (out / parts[2]).write_bytes(z.read(info))
                names.append(parts[2])
    if not any(n.startswith("libexecutorch.so") for n in names):
        raise HarnessError(f"{whl} has no executorch/lib/libexecutorch.so", "check the wheel (executorch 1.5.1 ships it)")
    return sorted(names)


ARCHES = ("aarch64", "x86_64")  # a device bundle's runner: the Pi 5's, or this host's


def _toolchain(arch: str) -> tuple[str, str]:
    """(compiler, what identifies the libraries it links) for ``arch``."""
    if arch == "aarch64":
        return cross_compiler(), f"wheel {WHEEL_SHA256}"
    if arch == "x86_64":
        from importlib import metadata

        from harness.runtimes.native import compiler

        return compiler(), f"installed executorch {metadata.version('executorch')}"
    raise HarnessError(f"no device runner for architecture {arch!r}", f"choose one of {', '.join(ARCHES)}")


def build_key(arch: str = "aarch64") -> str:
    from harness.cache import cache_key
    from harness.runtimes.native import _compiler_version, compile_command, sources_digest

    cxx, libraries = _toolchain(arch)
    return cache_key(f"native-{arch}", sources=sources_digest(), libraries=libraries,
                     command=compile_command(Path("OUT"), cxx, lib=Path("LIB"), rpath="$ORIGIN/lib"),
                     compiler=_compiler_version(cxx))


def device_runner(arch: str = "aarch64") -> Path:
    """``et_native`` for ``arch`` with the C++ runtime libraries in ``lib/`` beside it (rpath
    ``$ORIGIN/lib``), from the artifact cache when its key matches: a directory that runs wherever
    it is copied, with no Python, torch or executorch installed. aarch64: cross-compiled against
    the pinned aarch64 wheel's libraries and checked under qemu as a Cortex-A76 (where qemu is
    here); x86_64: against the installed wheel's, and run here."""
    from harness.cache import ArtifactCache, sha256_file
    from harness.runtimes.native import _compiler_version, compile_command, compile_or_fail, executorch_root

    cxx, libraries = _toolchain(arch)

    def build(path: Path) -> dict:
        lib = path.parent / "lib"
        if arch == "aarch64":
            names = runtime_libraries(wheel(), lib)
        else:
            lib.mkdir()
            names = []
            for so in sorted((executorch_root() / "lib").glob("*.so*")):
                shutil.copyfile(so, lib / so.name)
                names.append(so.name)
        cmd = compile_command(path, cxx, lib=lib, rpath="$ORIGIN/lib")
        compile_or_fail(cmd, f"compiling the {arch} native runner")
        if elf_machine(path) != ELF_MACHINE[arch]:
            raise HarnessError(f"{path} is not an {arch} program (ELF machine {elf_machine(path)})",
                               f"check the compiler: {cxx}")
        names = prune_to_needed(path, lib, names)
        verify_command = runner_prefix(arch, path, "cortex-a76" if arch == "aarch64" else None, required=False)
        if verify_command:  # it must start: its libraries resolve, its kernels register (usage, exit 2)
            run = subprocess.run(verify_command, capture_output=True, text=True, timeout=120)
            if run.returncode != 2 or "usage: et_native" not in run.stderr:
                raise HarnessError(f"the {arch} runner does not start (exit {run.returncode}: "
                                   f"{(run.stderr.strip().splitlines() or ['no output'])[-1]})",
                                   "run by hand: " + " ".join(verify_command))
        return {"arch": arch, "command": cmd, "compiler": _compiler_version(cxx), "linked": libraries,
                "libraries": {n: sha256_file(lib / n) for n in names}}

    path = ArtifactCache().get_or_build(f"native-{arch}", build_key(arch), "et_native", build)
    check_libraries(path)
    return path


def aarch64_runner() -> Path:
    return device_runner("aarch64")


def runner_prefix(arch: str, runner: Path, cpu: str | None = None, qemu_name: str | None = None,
                  required: bool = True) -> list[str] | None:
    """How to start ``runner`` (built for ``arch``) on this machine: directly when it is this
    machine's architecture and no CPU is to be emulated, else through qemu as ``cpu``. None
    when that needs qemu and it is missing and not ``required``."""
    import platform

    if arch == platform.machine() and not cpu:
        return [str(runner)]
    if arch != "aarch64":
        raise HarnessError(f"the runner is built for {arch}, which this {platform.machine()} machine cannot run"
                           + (" under qemu-aarch64" if cpu else ""),
                           "build the bundle for this machine (harness bench bundle DIR --arch "
                           f"{platform.machine()}), or an aarch64 one to emulate")
    if not cpu:
        raise HarnessError(f"the runner is built for aarch64, and this machine is {platform.machine()}",
                           "emulate the Pi 5's CPU with --pi5-emulate cortex-a76 (qemu-user), or run on the device")
    try:
        return [*emulator(cpu, qemu_name), str(runner)]
    except HarnessError:
        if required:
            raise
        return None


def prune_to_needed(runner: Path, lib: Path, names: list[str]) -> list[str]:
    """Keep only the libraries the runner loads, directly or through another (the wheel also
    ships e.g. an OpenVINO backend nobody here links)."""
    keep, todo = set(), [runner]
    while todo:
        for name in needed_libraries(todo.pop()):
            if name in names and name not in keep:
                keep.add(name)
                todo.append(lib / name)
    for name in set(names) - keep:
        (lib / name).unlink()
    return sorted(keep)


def check_libraries(runner: Path) -> None:
    """The libraries beside a cached runner still match the hashes recorded when it was built."""
    import json

    from harness.cache import sha256_file

    meta = json.loads((runner.parent / "meta.json").read_text())
    bad = [n for n, digest in meta.get("libraries", {}).items()
           if not (runner.parent / "lib" / n).is_file() or sha256_file(runner.parent / "lib" / n) != digest]
    if bad:
        shutil.rmtree(runner.parent, ignore_errors=True)
        raise HarnessError(f"the aarch64 runner's libraries are damaged ({', '.join(bad)}); the entry was removed",
                           "run again to rebuild it")


def elf_machine(path: Path) -> int:
    head = Path(path).read_bytes()[:20]
    if head[:4] != b"\x7fELF":
        raise HarnessError(f"{path} is not an ELF file", "build it again")
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def check_aarch64(path: Path) -> None:
    if elf_machine(path) != EM_AARCH64:
        raise HarnessError(f"{path} is not an aarch64 program (ELF machine {elf_machine(path)})",
                           f"cross-compile it with {CROSS_CXX}")


def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF file of any architecture (``readelf -d``)."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise HarnessError(f"readelf could not read {path} ({out.stderr.strip()[:120]})", "install binutils")
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.stdout.splitlines() if "(NEEDED)" in line]


def arm_logits_problem(host, device, recipe: str, host_label: str, device_label: str, where: str) -> str | None:
    """The one comparison of another ISA's logits with the x86 runner's on the same ``.pte``
    (``arm_vs_x86/RECIPE`` in harness/tolerances.py): None within it, else one line naming both."""
    from harness.compare import compare_tensors

    return compare_tensors(host, device, f"arm_vs_x86/{recipe}", host_label, device_label, where)
