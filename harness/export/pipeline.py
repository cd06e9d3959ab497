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


STREAM_ABOVE_BYTES = 4 << 30  # FP32 bytes past which a quantizing build streams by default
# .pt2 bytes up to which the lowering writes the ETRecord too: the fixture (a few MB) and the generated
# small checkpoint; not E2B (3.6 GB, whose lowering peaks at 14.4 of its 16 GiB without the copy)
ETRECORD_WITH_LOWERING_MAX_BYTES = 1 << 30


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
        stream: bool | None = None,
    ):
        self._model_spec = model
        self._stream = stream
        self.recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
        self.settings = settings or ExportSettings()
        self.cache = cache or ArtifactCache()
        self.records: dict[str, StageRecord] = {}
        self.progress = progress or (lambda msg: None)
        self._reloaded: dict = {}  # the .pt2's program as its verification reloaded it, until asked for

    @cached_property
    def streamed(self) -> bool:
        """Whether the checkpoint is read and quantized module by module (harness/export/stream.py)
        instead of loaded whole in FP32 and then quantized: asked for, or by default for a quantizing
        recipe on a checkpoint directory whose FP32 weights exceed ``STREAM_ABOVE_BYTES``. The model
        is the same bit for bit; only the FP32 model is never held (no FP32 stages then)."""
        if self._stream is not None:
            return bool(self._stream)
        from harness.models.size import model_size
        from harness.models.spec import resolve

        spec = self._model_spec
        if isinstance(spec, LoadedModel) or resolve(spec).kind != "directory" or not self.recipe.quantizes:
            return False
        return model_size(spec).fp32_bytes > STREAM_ABOVE_BYTES

    @cached_property
    def loaded(self) -> LoadedModel:
        t0 = time.time()
        spec = self._model_spec
        if self.streamed:
            return self._stream_load()
        loaded = spec if isinstance(spec, LoadedModel) else shared_model(str(spec))
        self.records["load"] = StageRecord(time.time() - t0, param_bytes(loaded.model))
        return loaded

    def _stream_load(self) -> LoadedModel:
        from harness.export.quantized import load_quantized_cached
        from harness.models.load import load_directory_meta

        t0 = time.time()
        self.progress(f"loading and quantizing {self._model_spec} [{self.recipe.name}] module by module "
                      "(or taking it from the artifact cache) ...")
        model, self.quant_summary = load_quantized_cached(self._model_spec, self.recipe, self.cache, progress=self.progress)
        self.records["load+quantize"] = StageRecord(time.time() - t0, param_bytes(model), self.quant_summary["cached"])
        return load_directory_meta(self._model_spec, model, quantized=self.recipe.name)

    @property
    def fp32_model(self):
        """The FP32 model, which a streamed pipeline never holds."""
        if self.streamed:
            from harness.errors import HarnessError

            raise HarnessError(f"{self._model_spec} was loaded quantized ({self.recipe.name}, streamed): "
                               "there is no FP32 model to run", "run the recipe's own stages, or use a "
                               "machine that holds the FP32 model and pass stream=False")
        return self.loaded.model

    @cached_property
    def quantized(self):
        """The recipe applied to a copy of the FP32 model (the FP32 model itself for ``fp32``)."""
        from harness.export.quantize import quantize

        if self.streamed:
            return self.loaded.model
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
        from harness.export.torch_export import export_program
        from harness.export.pt2 import save_pt2

        def build(path: Path):
            self.progress(f"exporting {self.loaded.name} [{self.recipe.name}] with torch.export ...")
            t0 = time.time()
            ep = export_program(self.quantized, self.settings, self.recipe.export)
            save_pt2(ep, path, keep=self._reloaded)
            del ep
            return {"export_seconds": round(time.time() - t0, 2)}

        return self._built("pt2", "program.pt2", build)

    @cached_property
    def exported(self):
        """The ExportedProgram, as reloaded from the verified ``.pt2`` (what users ship)."""
        from harness.export.pt2 import load_pt2

        if self.recipe.export == "fast":  # the program calls llama:: ops: register them first
            from harness.oplib import load_custom_ops_for_export

            load_custom_ops_for_export()
        path = self.pt2_path
        if "program" in self._reloaded:  # just written: the reload that verified the file (same bytes)
            return self._reloaded.pop("program")
        return load_pt2(path)

    @cached_property
    def pte_path(self) -> Path:
        from harness.export.lower import lower
        from harness.export.pte import write_pte

        def build(path: Path):
            self.progress(f"lowering {self.loaded.name} [{self.recipe.name}] to XNNPACK (minutes) ...")
            t0 = time.time()
            exported = [self.exported]  # lower() lets go of it once lowered; reloaded if asked for again
            self.__dict__.pop("exported", None)
            keep = self.etrecord_with_lowering
            program, report = lower(exported, self.recipe, runner_metadata(self.loaded, self.settings, self.recipe),
                                    etrecord=keep)
            lower_s = time.time() - t0
            record = program.get_etrecord() if keep else None
            box = [program]  # write_pte lets go of the program before it reloads the file to verify
            del program
            write_pte(box, path)
            if record is not None:
                self._keep_etrecord(record, path)
            return {"lower_seconds": round(lower_s, 2), "ops": report.as_dict(), "etrecord_kept": keep}

        return self._built("pte", "model.pte", build)

    @cached_property
    def etrecord_with_lowering(self) -> bool:
        """Whether the lowering also writes ExecuTorch's ETRecord into the artifact cache (stage
        ``etrecord``, the ``.pte``'s key), so that harness/goldens/pte_gap.py never lowers a second
        time: for programs up to ``ETRECORD_WITH_LOWERING_MAX_BYTES`` (the record deep-copies the
        edge program, one more copy of the weights while lowering). Set it to skip or force."""
        return self.pt2_path.stat().st_size <= ETRECORD_WITH_LOWERING_MAX_BYTES

    def _keep_etrecord(self, record, pte: Path) -> None:
        from harness.cache import sha256_file

        want = sha256_file(pte)

        def build(path: Path):
            record.save(str(path))
            return {"pte_sha256": want}

        self.cache.get_or_build("etrecord", self._key("pte"), "etrecord.bin", build)

    def release_model(self) -> None:
        """Free the in-memory model's tensors once the verified ``.pt2`` holds the program (the
        lowering reads the reload): at E2B size the quantized model is 5 GB that lowering does not
        need. Its config and generation settings stay for the cache keys and runner metadata; the
        eager stages are gone from this pipeline afterwards."""
        import gc

        self.pt2_path
        for module in self.quantized.modules():
            for name in list(module._parameters):
                module._parameters[name] = None
        self.__dict__["released"] = True
        gc.collect()
        from harness.rss import return_freed_memory

        return_freed_memory()

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
