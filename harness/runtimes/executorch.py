"""The ``executorch`` runtime: a ``.pte`` through ExecuTorch's Python runtime
(``executorch.runtime``), the program's ``forward`` called once per step.

The KV cache lives in the method's mutable buffers and persists between calls; a new prompt
starting at position 0 resets each layer's write counter, and slots past the current position
are masked, so no explicit reset is needed between prompts."""

from __future__ import annotations

import time
from pathlib import Path

from harness.export.pte import load_program
from harness.errors import HarnessError
from harness.runtimes.base import Runtime, register
from harness.runtimes.pytorch import as_long


def set_threads(threads: int | None) -> None:
    """ExecuTorch's threadpool (XNNPACK's threads) and torch's, for the tensors around the calls."""
    if threads:
        import torch
        from executorch.extension.pybindings import portable_lib

        torch.set_num_threads(int(threads))
        portable_lib._unsafe_reset_threadpool(int(threads))


@register
class PteRuntime(Runtime):
    """A loaded ``.pte`` (sealed, verified): ``step(ids, positions) -> logits[1, s, V]``."""

    kind = "executorch"

    def __init__(self, artifact, threads: int | None = None):
        set_threads(threads)
        t0 = time.perf_counter()
        self.path = self.artifact = Path(artifact)
        self.program, self.method = load_program(self.path)
        self.load_s = time.perf_counter() - t0
        meta = self.metadata()
        self.max_context = int(meta["get_max_context_len"]) if "get_max_context_len" in meta else None
        self.vocab_size = int(meta["get_vocab_size"]) if "get_vocab_size" in meta else None

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

    def step(self, ids, positions):
        return self.method.execute([as_long([ids] if isinstance(ids, list) else ids), as_long(positions)])[0]
