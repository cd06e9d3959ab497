"""Resident memory of this process: now, and its peak (the pre-flight's calibration and the
benchmarks' memory figures)."""

from __future__ import annotations


def peak_rss_mb() -> float:
    """This process's peak resident set: VmHWM from /proc/self/status. Not ``ru_maxrss``: Linux
    carries that across fork+exec, so a child spawned by a big pytest process would report its
    parent's peak. (macOS has no /proc: ru_maxrss there, in bytes.)"""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / (1 << 20)


def return_freed_memory() -> None:
    """Hand freed heap pages back to the system: glibc keeps freed tensors under its mmap
    threshold (32 MB at most; most of a model's weights) in its arenas, where they still count as
    resident, so a released 5 GB model would stay in every later stage's peak."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass
