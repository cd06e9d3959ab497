"""Serialize stage (``.pte``: atomic write, then reload) and run stage (``executorch.runtime``)."""

from __future__ import annotations

from pathlib import Path

from harness.atomic import atomic_path
from harness.errors import HarnessError

PTE_MAGIC = b"ET"  # flatbuffer file identifier "ET12" at bytes 4..8; the 2 digits are the version
PTE_HEADER_LEN = 8


def _ensure_kernels() -> None:
    # The INT8 embedding lowers to quantized_decomposed::embedding_byte, a kernel that lives in
    # executorch.kernels.quantized; without this import loading the method fails with 0x14.
    import executorch.kernels.quantized  # noqa: F401
    # The fast recipe's llama::custom_sdpa / update_cache kernels (harness/fast.py): a shared
    # library load, without it loading the method fails on the missing llama:: kernels.
    from harness.fast import load_custom_ops

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


def write_pte(buffer: bytes, path: Path) -> Path:
    """Atomic write, then reload from disk (header, flatbuffer verification, method load)."""
    path = Path(path)
    from harness.atomic import check_writable

    check_writable(path, need_bytes=len(buffer) + (16 << 20))
    with atomic_path(path, verify=lambda p: load_program(p)) as tmp:
        with open(tmp, "wb") as f:
            f.write(buffer)
    return path


class PteRunner:
    """A loaded ``.pte`` method; ``step(ids[1,s], cache_position[s]) -> logits[1,s,V]``.

    The KV cache lives in the method's mutable buffers and persists between calls; a new prompt
    starting at position 0 resets each layer's write counter, and slots past the current
    position are masked, so no explicit reset is needed between prompts."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.program, self.method = load_program(self.path)

    def metadata(self) -> dict:
        out = {}
        for name in self.program.method_names:
            if name == "forward":
                continue
            try:
                values = list(self.program.load_method(name).execute([]))
            except Exception as e:
                raise HarnessError(f"{self.path}: metadata method {name} failed ({e})",
                                   "re-export the .pte with: harness export") from e
            out[name] = values[0] if len(values) == 1 else values
        return out

    def step(self, input_ids, cache_position):
        return self.method.execute([input_ids, cache_position])[0]
