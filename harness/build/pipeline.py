"""The build: load → quantize → export (``.pt2``) → lower → serialize (``.pte``).

Each stage is built lazily, once, and the expensive artifacts (``.pt2``, ``.pte``) come from the
artifact cache when their key matches. ``records`` feeds the main job's per-stage table. Running
the artifacts is harness/pipeline.py's ``Pipeline`` (this class plus a runtime per stage), kept
out of this package so that editing how models run never invalidates a cached artifact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from harness.cache import ArtifactCache, cache_key
from harness.models.load import LoadedModel
from harness.models.spec import load_model
from harness.program import ExportSettings, runner_metadata
from harness.recipes import Recipe, get_recipe


@lru_cache(maxsize=4)
def shared_model(spec: str) -> LoadedModel:
    """One FP32 load per model spec per process; stages copy before they mutate."""
    return load_model(spec)


@dataclass
class StageRecord:
    seconds: float = 0.0
    bytes: int | None = None
    cached: bool = False


class BuildPipeline:
    def __init__(
        self,
        model: str | LoadedModel = "fixture",
        recipe: str | Recipe = "fp32",
        settings: ExportSettings | None = None,
        cache: ArtifactCache | None = None,
        progress=None,
    ):
        self._model_spec = model
        self.recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
        self.settings = settings or ExportSettings()
        self.cache = cache or ArtifactCache()
        self.records: dict[str, StageRecord] = {}
        self.progress = progress or (lambda msg: None)

    @cached_property
    def loaded(self) -> LoadedModel:
        t0 = time.time()
        spec = self._model_spec
        loaded = spec if isinstance(spec, LoadedModel) else shared_model(str(spec))
        self.records["load"] = StageRecord(time.time() - t0, param_bytes(loaded.model))
        return loaded

    @cached_property
    def quantized(self):
        """The recipe applied to a copy of the FP32 model (the FP32 model itself for ``fp32``)."""
        from harness.build.quantize import quantize

        t0 = time.time()
        model, self.quant_summary = quantize(self.loaded.model, self.recipe)
        model.requires_grad_(False)
        self.records["quantize"] = StageRecord(time.time() - t0, param_bytes(model))
        return model

    def _key(self, stage: str) -> str:
        return cache_key(
            stage,
            model=self.loaded.identity,
            config=self.loaded.config.to_json_string(use_diff=False),
            recipe=self.recipe.as_dict(),
            settings=self.settings.as_dict(),
            metadata=runner_metadata(self.loaded, self.settings, self.recipe) if stage == "pte" else None,
        )

    def _built(self, stage: str, filename: str, build) -> Path:
        t0 = time.time()
        path = self.cache.get_or_build(stage, self._key(stage), filename, build)
        hit = self.cache.events[-1][2] == "hit"
        self.records["export" if stage == "pt2" else "lower+serialize"] = StageRecord(
            time.time() - t0, path.stat().st_size, hit)
        return path

    @cached_property
    def pt2_path(self) -> Path:
        from harness.build.export import export_program
        from harness.build.pt2 import save_pt2

        def build(path: Path):
            self.progress(f"exporting {self.loaded.name} [{self.recipe.name}] with torch.export ...")
            t0 = time.time()
            ep = export_program(self.quantized, self.settings, self.recipe.export)
            save_pt2(ep, path)
            return {"export_seconds": round(time.time() - t0, 2)}

        return self._built("pt2", "program.pt2", build)

    @cached_property
    def exported(self):
        """The ExportedProgram, as reloaded from the verified ``.pt2`` (what users ship)."""
        from harness.build.pt2 import load_pt2

        if self.recipe.export == "fast":  # the program calls llama:: ops: register them first
            from harness.oplib import load_custom_ops_for_export

            load_custom_ops_for_export()
        return load_pt2(self.pt2_path)

    @cached_property
    def pte_path(self) -> Path:
        from harness.build.lower import lower
        from harness.build.pte import write_pte

        def build(path: Path):
            self.progress(f"lowering {self.loaded.name} [{self.recipe.name}] to XNNPACK (minutes) ...")
            t0 = time.time()
            program, report = lower(self.exported, self.recipe,
                                    runner_metadata(self.loaded, self.settings, self.recipe))
            lower_s = time.time() - t0
            write_pte(program.buffer, path)
            return {"lower_seconds": round(lower_s, 2), "ops": report.as_dict()}

        return self._built("pte", "model.pte", build)

    @property
    def lower_report(self) -> dict:
        self.pte_path
        return self.cache.meta("pte", self._key("pte")).get("ops", {})


def param_bytes(model) -> int:
    """Bytes the model's tensors hold: a torchao quantized weight counts its inner tensors
    (INT8/INT4 codes, scales, zero points), not its logical FP32 shape; tied weights once."""
    total, seen = 0, set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        names = getattr(t, "tensor_data_names", None)
        if names:
            total += sum(getattr(t, n).numel() * getattr(t, n).element_size() for n in names
                         if getattr(t, n, None) is not None)
        else:
            total += t.numel() * t.element_size()
    return total
