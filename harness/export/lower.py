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


def drop_delegated_weights(edge) -> int:
    """Let go of the weights each XNNPACK delegate has already packed into its own data: the
    lowered module keeps its partition's original program, whose graph the emitter reads but
    whose tensors nothing reads again (at E2B size 2.3 GB held through emission). They become
    one-element tensors of the same shape and dtype (stride 0; meta tensors trip a later pass's
    fake-tensor device check); returns the bytes let go.
    tests/test_lower_memory.py holds the written program byte-identical with and without this."""
    import torch
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    freed = 0
    for _, lowered, _ in get_lowered_submodules(edge.exported_program().graph_module):
        program = lowered.original_module
        for table in (program.state_dict, program.constants):
            for name, t in list(table.items()):
                if not isinstance(t, torch.Tensor) or hasattr(t, "tensor_data_names") or t.is_meta:
                    continue  # (a tensor subclass would not survive empty_like; none reach here)
                freed += t.numel() * t.element_size()
                empty = torch.empty_strided(t.shape, (0,) * t.dim(), dtype=t.dtype)  # one element
                table[name] = torch.nn.Parameter(empty, requires_grad=False) if isinstance(t, torch.nn.Parameter) else empty
    return freed


def lower(ep, recipe: Recipe, constant_methods: dict | None = None, drop_weights: bool = True,
          lean: bool = True, etrecord: bool = False):
    """Return (ExecutorchProgramManager, LowerReport). ``ep`` may come in a one-element list, which
    is emptied once the edge program exists, so that the caller's reference does not keep the
    delegated weights alive through emission (``drop_delegated_weights``). ``lean``: trace under
    harness/export/lean.py (the same program, 14-30% faster). ``etrecord``: ExecuTorch's debug
    record as well (``program.get_etrecord()``: the programs before and after lowering, by debug
    handle), for harness/goldens/pte_gap.py; the program itself is the same bytes."""
    from contextlib import nullcontext

    from harness.export.lean import lean_tracing

    with lean_tracing() if lean else nullcontext():
        return _lower(ep, recipe, constant_methods, drop_weights, etrecord)


def _lower(ep, recipe: Recipe, constant_methods: dict | None, drop_weights: bool, etrecord: bool = False):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower

    box = ep if isinstance(ep, list) else None
    if box is not None:
        ep = box.pop()
    edge = to_edge_transform_and_lower(
        ep,
        partitioner=[XnnpackPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
        constant_methods=constant_methods,
        generate_etrecord=etrecord,
    )
    del ep
    if drop_weights:
        import gc

        from harness.rss import return_freed_memory

        drop_delegated_weights(edge)
        gc.collect()
        return_freed_memory()
    report = op_report(edge.exported_program().graph_module)
    # inference_mode: to_executorch evaluates parts of the graph; under autograd the in-place
    # cache update trips "a leaf Variable that requires grad" (the deployment log, phase 5).
    with torch.inference_mode():
        program = edge.to_executorch(
            ExecutorchBackendConfig(do_quant_fusion_and_const_prop=recipe.linear is not None
                                    or recipe.per_layer_embedding is not None)
        )
    return program, report
