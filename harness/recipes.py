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
    description: str = ""

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
    )
}


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise HarnessError(
            f"unknown recipe {name!r}", f"choose one of: {', '.join(sorted(RECIPES))}"
        ) from None
