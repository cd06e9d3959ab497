"""Recipes: named sets of stage settings. One table; everything else looks names up here."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.errors import HarnessError


@dataclass(frozen=True)
class Recipe:
    name: str
    linear: str | None = None  # None (FP32) or "8da4w": INT8 dynamic activations, INT4 weights per group
    group_size: int | None = None  # None: 128 where every quantized in_features allows it, else 32
    per_layer_embedding: str | None = None  # None (FP32) or "int8": INT8 per-row, the E2B table
    embedding: str | None = None  # None (FP32, as transformers ties it) or "int8"/"int4": the token table
    export: str = "hf"  # "hf": transformers' exportable wrapper; "fast": harness/export/fast/ (custom ops)
    description: str = ""

    @property
    def quantizes(self) -> bool:
        return any(x is not None for x in (self.linear, self.per_layer_embedding, self.embedding))

    def as_dict(self) -> dict:
        return asdict(self)


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("fp32", description="no quantization: the reference every other recipe is held to"),
        Recipe(
            "8da4w",
            linear="8da4w",
            per_layer_embedding="int8",
            description="INT8 dynamic activations + INT4 weights per group on every linear, "
            "INT8 per-row per-layer embedding table (the deployment log's final recipe)",
        ),
        Recipe(
            "8da4w-fast",
            linear="8da4w",
            per_layer_embedding="int8",
            embedding="int4",
            export="fast",
            description="8da4w's quantization exported through harness/export/fast/: ExecuTorch's custom "
            "SDPA and KV-cache ops, ring-buffer caches on sliding layers, the decoder delegated to "
            "XNNPACK, the token table INT4 and stored once for the lookup and the tied lm_head "
            "(harness::q4_linear); says what 8da4w says",
        ),
    )
}


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise HarnessError(
            f"unknown recipe {name!r}", f"choose one of: {', '.join(sorted(RECIPES))}"
        ) from None


def golden_recipe(name: str) -> str:
    """The recipe whose committed goldens ``name`` must reproduce: a fast-path recipe has no
    goldens of its own, it must say exactly what its reference recipe says (``8da4w-fast`` →
    ``8da4w``)."""
    recipe = get_recipe(name)
    return name.removesuffix("-fast") if recipe.export == "fast" else name


# Recipes that own goldens (the fast path is held to its reference's, tests/test_fast_path.py).
GOLDEN_RECIPES = [name for name in RECIPES if golden_recipe(name) == name]
