"""Quantize stage: apply a recipe to a (copy of a) model with torchao's library configs.

Linears: ``Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, PerGroup(g))``, which
XNNPACK lowers to its dynamically quantized INT4 kernels (g must be a multiple of 32 for
XNNPACK and divide ``in_features`` for torchao).
Per-layer embedding: ``IntxWeightOnlyConfig(int8, PerAxis(0))`` on ``embed_tokens_per_layer``
only, after clearing ``padding_idx`` (the quantized lookup asserts it is None; left at 0,
``to_executorch`` fails with "Missing out variants: torchao::dequantize_affine", as in the log).
The main ``embed_tokens`` (tied to ``lm_head``) is left to the recipe's ``embedding`` field: FP32
for ``8da4w`` (as transformers ties it), INT4 in ``lm_head``'s own groups for ``8da4w-fast``
(harness/export/fast/embedding.py).
"""

from __future__ import annotations

import copy

from harness.errors import HarnessError
from harness.recipes import Recipe

XNNPACK_GROUP_MULTIPLE = 32


def linear_in_features(model) -> list[int]:
    import torch

    return sorted(
        {m.in_features for m in model.modules() if isinstance(m, torch.nn.Linear)}
    )


def choose_group_size(model, recipe: Recipe) -> int:
    """128 where every linear's in_features allows it (as for E2B), else 32 (the fixture)."""
    dims = linear_in_features(model)
    candidates = [recipe.group_size] if recipe.group_size else [128, 64, 32]
    for g in candidates:
        if g % XNNPACK_GROUP_MULTIPLE == 0 and all(d % g == 0 for d in dims):
            return g
    raise HarnessError(
        f"recipe {recipe.name}: no INT4 group size in {candidates} divides every linear "
        f"in_features {dims} (XNNPACK needs a multiple of 32)",
        "use the fp32 recipe for this model, or a model whose dims are multiples of 32",
    )


def quantize(model, recipe: Recipe, inplace: bool = False):
    """Return a quantized model (a deep copy unless ``inplace``) and a summary dict."""
    import torch

    if recipe.linear is None and recipe.per_layer_embedding is None and recipe.embedding is None:
        return model, {"recipe": recipe.name}
    from torchao.quantization import (
        Int8DynamicActivationIntxWeightConfig,
        IntxWeightOnlyConfig,
        quantize_,
    )
    from torchao.quantization.granularity import PerAxis, PerGroup

    if not inplace:
        model = copy.deepcopy(model)
    summary: dict = {"recipe": recipe.name}
    if recipe.per_layer_embedding == "int8":
        ple = getattr(model.model, "embed_tokens_per_layer", None)
        if ple is None:
            raise HarnessError(
                "model has no embed_tokens_per_layer", f"recipe {recipe.name} is for Gemma 4 models"
            )
        ple.padding_idx = None
        quantize_(
            model,
            IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
            filter_fn=lambda m, fqn: m is ple,
        )
        summary["per_layer_embedding"] = "int8 per-row"
    if recipe.linear == "8da4w":
        group = choose_group_size(model, recipe)
        quantize_(
            model,
            Int8DynamicActivationIntxWeightConfig(
                weight_dtype=torch.int4, weight_granularity=PerGroup(group)
            ),
        )
        summary["linear"] = f"8da4w group {group}"
        summary["group_size"] = group
    elif recipe.linear is not None:
        raise HarnessError(f"recipe {recipe.name}: unknown linear scheme {recipe.linear}", "fix recipes.py")
    if recipe.embedding is not None:  # the token table; INT4 in lm_head's own groups
        from harness.export.fast.embedding import quantize_embedding

        group = summary.get("group_size") or choose_group_size(model, recipe)
        summary.update(quantize_embedding(model, recipe.embedding, group))
    return model, summary
