"""Lower stage: edge dialect + XNNPACK partitioner, then the ExecuTorch program.

Reports how many XNNPACK delegate calls the graph has and which operators stay portable (run by
ExecuTorch's portable kernels instead of XNNPACK), with counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from harness.recipes import Recipe


@dataclass
class LowerReport:
    delegated_calls: int
    portable_ops: dict[str, int] = field(default_factory=dict)

    @property
    def portable_total(self) -> int:
        return sum(self.portable_ops.values())

    def as_dict(self) -> dict:
        return {"delegated_calls": self.delegated_calls, "portable_ops": self.portable_ops,
                "portable_total": self.portable_total}


def op_name(target) -> str:
    """``aten.mean.dim`` rather than the edge overload's full schema."""
    text = str(target)
    if text.startswith("<EdgeOpOverload: "):
        text = text[len("<EdgeOpOverload: "):].split(">")[0]
    return text.split(":")[0].strip()


def op_report(graph_module) -> LowerReport:
    delegated = 0
    portable: Counter = Counter()
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if "executorch_call_delegate" in name:
            delegated += 1
            continue
        if "getitem" in name:  # tuple plumbing, not a kernel
            continue
        portable[op_name(node.target)] += 1
    return LowerReport(delegated, dict(sorted(portable.items(), key=lambda kv: -kv[1])))


def lower(ep, recipe: Recipe, constant_methods: dict | None = None):
    """Return (ExecutorchProgramManager, LowerReport)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(
        ep,
        partitioner=[XnnpackPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
        constant_methods=constant_methods,
    )
    report = op_report(edge.exported_program().graph_module)
    # inference_mode: to_executorch evaluates parts of the graph; under autograd the in-place
    # cache update trips "a leaf Variable that requires grad" (the deployment log, phase 5).
    with torch.inference_mode():
        program = edge.to_executorch(
            ExecutorchBackendConfig(do_quant_fusion_and_const_prop=recipe.linear is not None
                                    or recipe.per_layer_embedding is not None)
        )
    return program, report
