"""The host in every figure: which CPU measured it, what its kernels could use, how much cache it
has, and where the threads ran. Two machines "of the same kind" gave the fast path 1.07× and 1.73×
llama.cpp's decode: one had AVX2 and a 32 MiB L3 that a 36 MB 4-bit model does not fit, the other
a 260 MiB L3 that holds it whole. A rate without these is not comparable.

Read from ``/proc/cpuinfo`` (x86: model name, family, model, stepping, flags; ARM: implementer,
part, ``Features``) and ``/sys/devices/system/cpu/cpu0/cache`` (each level's size and which CPUs
share it); threads from the scheduler affinity. No root and no extra package: the same code runs
on the Pi 5 with only pytest installed, and records ``None`` for what a machine does not expose.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
# the ISA features the kernels here choose between (XNNPACK, KleidiAI, llama.cpp's ggml)
X86_FLAGS = {"avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512bw": "avx512bw",
             "avx512_vnni": "avx512_vnni", "avx_vnni": "avx_vnni", "avx512_bf16": "avx512_bf16", "amx_int8": "amx_int8"}
ARM_FEATURES = {"asimd": "neon", "asimddp": "dotprod", "i8mm": "i8mm", "fphp": "fp16", "asimdrdm": "rdm",
                "sve": "sve", "sve2": "sve2", "sme": "sme", "bf16": "bf16"}
ARM_PARTS = {("0x41", "0xd0b"): "Cortex-A76", ("0x41", "0xd08"): "Cortex-A72", ("0x41", "0xd05"): "Cortex-A55",
             ("0x41", "0xd0c"): "Neoverse-N1", ("0x41", "0xd40"): "Neoverse-V1", ("0x41", "0xd4f"): "Neoverse-V2"}


def parse_cpuinfo(text: str) -> dict:
    """The first processor's identity and the ISA features the kernels use, from /proc/cpuinfo."""
    first: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip():
            if first:
                break
            continue
        key, value = (line.split(":", 1) + [""])[:2]
        first.setdefault(key.strip(), value.strip())
    if "flags" in first:  # x86
        flags = set(first["flags"].split())
        return {"model": first.get("model name"), "family": _int(first.get("cpu family")),
                "model_number": _int(first.get("model")), "stepping": _int(first.get("stepping")),
                "isa": sorted(name for flag, name in X86_FLAGS.items() if flag in flags)}
    if "Features" in first:  # aarch64
        features = set(first["Features"].split())
        implementer, part = first.get("CPU implementer", "").lower(), first.get("CPU part", "").lower()
        return {"model": ARM_PARTS.get((implementer, part), f"implementer {implementer} part {part}"),
                "family": None, "model_number": _int(part, 16), "stepping": _int(first.get("CPU revision")),
                "isa": sorted(name for flag, name in ARM_FEATURES.items() if flag in features)}
    return {"model": None, "family": None, "model_number": None, "stepping": None, "isa": []}


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, 0 if base == 16 else base) if text else None
    except ValueError:
        return None


_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)", re.I)


def parse_size(text: str) -> int | None:
    m = _SIZE.match(text or "")
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def caches(root: Path = CACHE) -> list[dict]:
    """cpu0's caches: level, type, bytes, and the CPUs that share each."""
    out = []
    for index in sorted(root.glob("index*")):
        read = lambda name: (index / name).read_text().strip() if (index / name).is_file() else None  # noqa: E731
        out.append({"level": _int(read("level")), "type": read("type"), "bytes": parse_size(read("size") or ""),
                    "shared_with": read("shared_cpu_list")})
    return out


def host_info(threads: int | None = None) -> dict:
    """Everything above for this machine, and the threads a benchmark runs with and where."""
    try:
        cpu = parse_cpuinfo(CPUINFO.read_text())
    except OSError:
        cpu = parse_cpuinfo("")
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    return {"machine": platform.machine(), **cpu, "caches": caches(), "cpus_online": os.cpu_count(),
            "threads": threads, "affinity": allowed}


def describe(info: dict) -> str:
    """One line for a report: ``AMD EPYC (family 25 model 17 stepping 1), avx2 avx512f ...; L2 1 MiB,
    L3 32 MiB (shared 0-1); 2 threads on CPUs 0-1``."""
    ident = info.get("model") or info.get("machine") or "unknown CPU"
    nums = [f"{k} {info[v]}" for k, v in (("family", "family"), ("model", "model_number"), ("stepping", "stepping"))
            if info.get(v) is not None]
    levels = [f"L{c['level']} {_mib(c['bytes'])}" + (f" (shared {c['shared_with']})" if c.get("level") == 3 else "")
              for c in info.get("caches") or [] if c.get("type") != "Instruction" and c.get("bytes")]
    cpus = info.get("affinity") or []
    return (f"{ident}" + (f" ({' '.join(nums)})" if nums else "") + f"; ISA: {' '.join(info.get('isa') or []) or 'n/a'}"
            + (f"; {', '.join(levels)}" if levels else "")
            + (f"; {info['threads']} threads" if info.get("threads") else "")
            + (f" on CPUs {_ranges(cpus)}" if cpus else ""))


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _ranges(cpus: list[int]) -> str:
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)
