"""``lm_head`` on the shared INT4 token table (``harness::q4_linear``, harness/export/fast/tied.py)
against XNNPACK's own packed copy (what ``8da4w-fast`` used before), alone, in one process, the
passes alternating:

    python -m harness.bench.tied                 # E2B's lm_head: 262144 x 1536, group 128
    python -m harness.bench.tied V D G ROUNDS

Prints JSON: per token count (1: a decode step; 64: a prefill chunk), the median milliseconds of
each side and their ratio, and each side's max |diff| from the eager definition."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from harness.export.fast.tied import pack, row_sums
from harness.oplib import define_harness_ops

_BUFFERS: list = []  # a program loaded from a buffer reads it in place: it must outlive the program


def quantized_head(d: int, v: int, group: int, seed: int = 0):
    """An nn.Linear(d, v) quantized as 8da4w quantizes ``lm_head``: (module, qdata, scales)."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    torch.manual_seed(seed)
    lin = torch.nn.Linear(d, v, bias=False)
    with torch.no_grad():
        lin.weight.normal_(0.0, 0.05)
    m = torch.nn.Sequential(lin)
    quantize_(m, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group)))
    w = m[0].weight
    return m, w.qdata, w.scale


class Head(torch.nn.Module):
    """``harness::q4_linear`` on one packed table: x[1, m, d] -> [1, m, v]."""

    def __init__(self, packed, scales, softcap: float = 0.0):
        super().__init__()
        define_harness_ops()
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("row_sums", row_sums(packed, scales))
        self.softcap = softcap

    def forward(self, x):
        return torch.ops.harness.q4_linear(x, self.packed, self.scales, self.row_sums, self.softcap)


def load_program(module, d: int, max_tokens: int = 64, xnnpack: bool = False):
    """``module`` exported with a dynamic token count and loaded in ExecuTorch's Python runtime
    (delegated to XNNPACK if ``xnnpack``)."""
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    from harness.oplib import load_custom_ops

    load_custom_ops()
    m = torch.export.Dim("m", min=1, max=max_tokens)
    ep = torch.export.export(module, (torch.randn(1, 3, d),), dynamic_shapes=({1: m},))
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    else:
        edge = to_edge(ep)
    buf = edge.to_executorch().buffer
    _BUFFERS.append(buf)
    return _load_for_executorch_from_buffer(buf)


def compare(v: int = 262144, d: int = 1536, group: int = 128, rounds: int = 5, threads: int = 2,
            tokens: tuple[int, ...] = (1, 64)) -> dict:
    from executorch.extension.pybindings import portable_lib

    from harness.bench.host import host_info

    portable_lib._unsafe_reset_threadpool(threads)
    eager, q, s = quantized_head(d, v, group)
    sides = {"q4_linear": load_program(Head(pack(q), s), d, max(tokens)),
             "xnnpack": load_program(eager, d, max(tokens), xnnpack=True)}
    out: dict = {"host": host_info(), "shape": {"vocab": v, "hidden": d, "group": group}, "threads": threads,
                 "rounds": rounds, "tokens": {}}
    for m in tokens:
        x = torch.randn(1, m, d)
        want = eager(x)
        times: dict = {name: [] for name in sides}
        for name, prog in sides.items():
            prog.forward([x])  # warm: first-call planning and packing
        for _ in range(rounds):
            for name, prog in sides.items():
                t0 = time.perf_counter()
                prog.forward([x])
                times[name].append(time.perf_counter() - t0)
        row = {name: {"ms": round(statistics.median(times[name]) * 1e3, 3),
                      "max_abs_diff_from_eager": float((prog.forward([x])[0] - want).abs().max())}
               for name, prog in sides.items()}
        row["q4_linear_over_xnnpack_time"] = round(row["q4_linear"]["ms"] / row["xnnpack"]["ms"], 3)
        out["tokens"][str(m)] = row
    return out


def _main(argv: list[str]) -> int:
    args = [int(a) for a in argv]
    if len(args) not in (0, 3, 4):
        print("usage: python -m harness.bench.tied [VOCAB HIDDEN GROUP [ROUNDS]]", file=sys.stderr)
        return 2
    res = compare(*args[:3], *(args[3:] or [])) if args else compare()
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
