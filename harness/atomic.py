"""Atomic, verified writes: a temp file beside the target, fsync, verify, then rename."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from harness.errors import HarnessError


def check_writable(path: Path, need_bytes: int = 0) -> None:
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise HarnessError(f"output directory {parent} does not exist", "create it or choose another --out")
    if not os.access(parent, os.W_OK):
        raise HarnessError(f"output directory {parent} is not writable", "choose a writable --out path")
    if need_bytes:
        free = shutil.disk_usage(parent).free
        if free < need_bytes:
            raise HarnessError(
                f"not enough free disk in {parent}: {free / 1e6:.0f} MB free, "
                f"about {need_bytes / 1e6:.0f} MB needed",
                "free some space or write elsewhere",
            )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_partials(path: Path) -> list[Path]:
    """Remove temp files a killed writer left beside ``path`` (their pid is in the name)."""
    removed = []
    for tmp in Path(path).resolve().parent.glob(f".{Path(path).name}.*.partial"):
        parts = tmp.name[len(Path(path).name) + 2:].split(".")
        if parts and parts[0].isdigit() and not _pid_alive(int(parts[0])):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


@contextlib.contextmanager
def atomic_path(path: Path, verify: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Yield a temp path in the target's directory; on success verify it, then rename over
    ``path``. On any failure (or a kill) the target keeps its old content or stays absent."""
    path = Path(path)
    check_writable(path)
    sweep_stale_partials(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".partial",
                               dir=path.resolve().parent)
    os.close(fd)
    tmp = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; an exported artifact is an ordinary file
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if verify is not None:
            verify(tmp)
        os.replace(tmp, path)
        dfd = os.open(path.resolve().parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes_atomic(path: Path, data: bytes, verify: Callable[[Path], None] | None = None) -> None:
    with atomic_path(path, verify) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
