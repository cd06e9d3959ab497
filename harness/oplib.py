"""ExecuTorch's LLM custom-op library (``llama::custom_sdpa``, ``update_cache``...): registered for
export by the fast recipe, and for running by every runtime that loads a program calling them."""

from __future__ import annotations

from harness.errors import HarnessError

CUSTOM_OPS_LIB = "libcustom_ops_aot_lib"


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
    _LOADED = True


def load_custom_ops_for_export() -> None:
    load_custom_ops()
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (meta kernels)
