"""Serialize stage: the ``.pte`` sealed with the sha256 of its content, written atomically, then
reloaded through ``executorch.runtime`` and verified (the runtime that runs it is
harness/runtimes/executorch.py)."""

from __future__ import annotations

from pathlib import Path

from harness.atomic import atomic_path
from harness.errors import HarnessError

PTE_MAGIC = b"ET"  # flatbuffer file identifier "ET12" at bytes 4..8; the 2 digits are the version
PTE_HEADER_LEN = 8
# The seal: every .pte the harness writes ends with the sha256 of everything before it. ExecuTorch
# finds its program and segments from the header's offsets and ignores trailing bytes (the Python
# runtime, TextLLMRunner and the native runner were checked), and its own verification checks
# structure, not data: a flipped weight byte loads and answers wrongly with exit 0 (found by
# tests/test_fuzz.py), and one in a delegate blob aborted the interpreter inside XNNPACK.
SEAL = b"\nharness-sha256:"
SEAL_LEN = len(SEAL) + 64 + 1


def seal(buffer: bytes) -> bytes:
    """The program with its seal appended (a program that already carries a valid one as it is)."""
    import hashlib

    body, tail = buffer[:-SEAL_LEN], buffer[-SEAL_LEN:]
    if tail.startswith(SEAL) and hashlib.sha256(body).hexdigest().encode() == tail[len(SEAL):-1]:
        return buffer
    return buffer + SEAL + hashlib.sha256(buffer).hexdigest().encode() + b"\n"


def check_seal(path: Path) -> bool:
    """True when the file carries the harness's seal and its content matches it, False when it
    carries none (a .pte from elsewhere); a broken seal is a one-line HarnessError."""
    import hashlib
    import re

    size = path.stat().st_size
    if size <= SEAL_LEN:
        return False
    with open(path, "rb") as f:
        f.seek(size - SEAL_LEN)
        tail = f.read(SEAL_LEN)
        if not tail.startswith(SEAL):
            return False
        want = tail[len(SEAL):-1]
        if not re.fullmatch(rb"[0-9a-f]{64}", want) or tail[-1:] != b"\n":
            raise HarnessError(f"{path} is damaged: its seal is unreadable", "re-export it with: harness export")
        h = hashlib.sha256()
        f.seek(0)
        left = size - SEAL_LEN
        while left:
            chunk = f.read(min(left, 1 << 22))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    if h.hexdigest().encode() != want:
        raise HarnessError(f"{path} is damaged: its content no longer matches the sha256 sealed into it at export",
                           "re-export it with: harness export, or copy it again")
    return True


def _ensure_kernels() -> None:
    # The INT8 embedding lowers to quantized_decomposed::embedding_byte, a kernel that lives in
    # executorch.kernels.quantized; without this import loading the method fails with 0x14.
    import executorch.kernels.quantized  # noqa: F401
    # The fast recipe's llama::custom_sdpa / update_cache kernels (harness/oplib.py): a shared
    # library load, without it loading the method fails on the missing llama:: kernels.
    from harness.oplib import load_custom_ops

    load_custom_ops()


def check_header(path: Path) -> None:
    path = Path(path)
    if not path.is_file():
        raise HarnessError(f".pte file {path} does not exist", "export one with: harness export --out FILE.pte")
    with open(path, "rb") as f:
        head = f.read(PTE_HEADER_LEN)
    if len(head) < PTE_HEADER_LEN or head[4:6] != PTE_MAGIC or not head[6:8].isdigit():
        raise HarnessError(
            f"{path} is not an ExecuTorch program (no 'ET..' identifier in its header)",
            "pass a .pte written by harness export",
        )
    check_seal(path)


def load_program(path: Path):
    """Load and fully verify a ``.pte``; raise a one-line HarnessError if it is damaged."""
    from executorch.runtime import Runtime, Verification

    _ensure_kernels()
    path = Path(path)
    check_header(path)
    try:
        program = Runtime.get().load_program(path, verification=Verification.InternalConsistency)
        method = program.load_method("forward")
    except Exception as e:
        raise HarnessError(
            f"{path} is a damaged or incompatible .pte ({type(e).__name__}: {str(e).splitlines()[0][:100]})",
            "re-export it with: harness export",
        ) from e
    if method is None:
        raise HarnessError(f"{path} has no 'forward' method", "re-export it with: harness export")
    return program, method


class _SealingWriter:
    """A file that hashes what is written through it, so the seal needs no second copy."""

    def __init__(self, f):
        import hashlib

        self.f, self.sha, self.n = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.n += len(data)
        return self.f.write(data)

    def seal(self) -> None:
        self.f.write(SEAL + self.sha.hexdigest().encode() + b"\n")


def write_pte(program, path: Path) -> Path:
    """Atomic write of the sealed program, then reload from disk (seal, header, flatbuffer
    verification, method load). ``program``: ExecuTorch's program manager, streamed piece by piece
    (``write_to_file``; its ``buffer`` would join the whole program into one more copy, and 4 GB at
    E2B size is what ran a 24 GB machine out of memory), the bytes of a program, or the path of a
    ``.pte`` to copy (copied as it is when it carries a valid seal). A program manager passed in a
    one-element list is dropped from it once written, before the verification reloads the file:
    at E2B size the manager holds 4 GB of serialized pieces and the reload as much again."""
    import gc
    import shutil

    from harness.atomic import check_writable

    path = Path(path)
    box = program if isinstance(program, list) else None
    if box is not None:
        program = box[0]
    if isinstance(program, (str, Path)):
        size = Path(program).stat().st_size
    else:
        size = len(program) if isinstance(program, (bytes, bytearray)) else len(program._pte_data)
    check_writable(path, need_bytes=size + (16 << 20))
    with atomic_path(path, verify=lambda p: check_seal(p) and load_program(p)) as tmp:
        if isinstance(program, (str, Path)) and check_seal(Path(program)):
            shutil.copyfile(program, tmp)
            return path
        with open(tmp, "wb") as f:
            if isinstance(program, (bytes, bytearray)):
                f.write(seal(bytes(program)))
                return path
            out = _SealingWriter(f)
            if isinstance(program, (str, Path)):
                with open(program, "rb") as src:
                    for chunk in iter(lambda: src.read(1 << 22), b""):
                        out.write(chunk)
            else:
                program.write_to_file(out)
            out.seal()
        if box is not None:
            box.clear()
            del program
            gc.collect()
            from harness.rss import return_freed_memory

            return_freed_memory()
    return path
