"""The operator libraries of fast-recipe programs, registered for export and for every runtime that
loads a program calling them: ExecuTorch's LLM custom ops (``llama::custom_sdpa``,
``update_cache``...), and the harness's own ``harness::q4_linear`` (the tied ``lm_head`` on the token
table's INT4 data, harness/export/fast/tied.py): its torch definition here, its ExecuTorch kernel in
harness/runtimes/cpp/tied_kernels.cpp.

``q4_linear``'s eager definition is torchao's 8da4w arithmetic on that data (INT8 asymmetric
per-token activations, quantized and dequantized, against the dequantized INT4 weights, an FP32
matmul), so the export wrapper says bit for bit what the quantized model's ``lm_head`` says."""

from __future__ import annotations

from harness.errors import HarnessError

CUSTOM_OPS_LIB = "libcustom_ops_aot_lib"


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """int8 [V, D] from ``embedding_4bit``'s packed INT4 layout (uint8 [V, D/2]: weight 2j in the
    high nibble of byte j, 2j+1 in the low one, each stored as w + 8)."""
    import torch

    hi = (packed >> 4).to(torch.int8) - 8
    lo = (packed & 15).to(torch.int8) - 8
    return torch.stack((hi, lo), dim=-1).reshape(packed.shape[0], -1)


def dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FP32 [V, D]: each weight times its group's scale (torchao's ``dequantize_affine`` with a
    zero point of 0 computes the same, one rounding per weight)."""
    import torch

    q = unpack(packed).to(torch.float32)
    v, d = q.shape
    return (q.reshape(v, scales.shape[1], -1) * scales.unsqueeze(-1)).reshape(v, d)


def _q4_linear(x, packed, scales, sums, softcap=0.0):
    import torch
    from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import (
        _apply_int8_act_asym_per_token_quant_dequant,
    )

    x_dq = _apply_int8_act_asym_per_token_quant_dequant(x)
    y = torch.nn.functional.linear(x_dq, dequantize(packed, scales))
    if softcap:  # Gemma's final logit softcapping, as the model applies it after lm_head
        y = torch.tanh(y / softcap) * softcap
    return y


def _q4_linear_out(x, packed, scales, sums, softcap=0.0, *, out):
    out.copy_(_q4_linear(x, packed, scales, sums, softcap))
    return out


def define_harness_ops() -> None:
    """Define ``harness::q4_linear`` (and ``.out``) for torch: eager, export and reloading a ``.pt2``."""
    import torch

    try:
        torch.ops.harness.q4_linear.default
        return  # defined already (this module imported under another name)
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("harness", "DEF")
    lib.define("q4_linear(Tensor x, Tensor packed, Tensor scales, Tensor row_sums, float softcap=0.0) -> Tensor")
    lib.define("q4_linear.out(Tensor x, Tensor packed, Tensor scales, Tensor row_sums, float softcap=0.0, *, "
               "Tensor(a!) out) -> Tensor(a!)")
    lib.impl("q4_linear", _q4_linear, "CompositeExplicitAutograd")
    lib.impl("q4_linear.out", _q4_linear_out, "CompositeExplicitAutograd")

    def fake(x, packed, scales, sums, softcap=0.0):
        return x.new_empty((*x.shape[:-1], packed.shape[0]))

    def fake_out(x, packed, scales, sums, softcap=0.0, *, out):
        return out

    torch.library.register_fake("harness::q4_linear", fake, lib=lib)
    torch.library.register_fake("harness::q4_linear.out", fake_out, lib=lib)
    _LIBS.append(lib)  # a Library unregisters its operators when collected


_LIBS: list = []




_LOADED = False


def load_custom_ops() -> None:
    """Register ``llama::custom_sdpa`` / ``update_cache`` (export) and their ``.out`` kernels
    (ExecuTorch runtime). Loading the shared library is enough for the runtime; the Python module
    ``executorch.extension.llm.custom_ops.custom_ops`` adds the meta kernels export needs (and
    imports torch._inductor, ~6 s), so export calls ``load_custom_ops_for_export()``."""
    global _LOADED
    if _LOADED:
        return
    import importlib.util

    import torch
    from pathlib import Path
    from executorch.extension.pybindings import portable_lib  # noqa: F401  (the runtime registry)

    try:
        torch.ops.llama.custom_sdpa.default  # already registered (e.g. by custom_ops.py)
    except (AttributeError, RuntimeError):
        spec = importlib.util.find_spec("executorch.extension.llm.custom_ops")
        if spec is None or not spec.submodule_search_locations:
            raise HarnessError("executorch.extension.llm.custom_ops is not installed",
                               "install the executorch wheel the harness pins (1.5.1)") from None
        libs = sorted(Path(next(iter(spec.submodule_search_locations))).glob(f"**/{CUSTOM_OPS_LIB}.*"))
        if not libs:
            raise HarnessError(f"{CUSTOM_OPS_LIB} not found in the executorch wheel",
                               "reinstall executorch 1.5.1") from None
        torch.ops.load_library(str(libs[0]))
    load_harness_kernels()
    _LOADED = True


_KERNELS = None


def load_harness_kernels() -> None:
    """Register the harness's own operators' run-time kernels (``harness::q4_linear.out``, the
    fast recipe's tied ``lm_head``: harness/runtimes/cpp/tied_kernels.cpp) with the executorch
    wheel's runtime in this process. Built on first use (a C++ compiler, a few seconds: 2.4 s on host B) and checked to load."""
    global _KERNELS
    if _KERNELS is not None:
        return
    import ctypes

    from executorch.extension.pybindings import portable_lib  # noqa: F401  (the runtime registry)

    from harness.runtimes.native import kernel_library

    _KERNELS = ctypes.CDLL(str(kernel_library()), mode=ctypes.RTLD_GLOBAL)


def load_custom_ops_for_export() -> None:
    load_custom_ops()
    define_harness_ops()
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (meta kernels)
