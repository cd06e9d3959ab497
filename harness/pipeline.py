"""The staged pipeline: load → quantize → export (.pt2) → lower → serialize (.pte) → run → generate.

Each stage is built lazily, once, and the expensive artifacts (``.pt2``, ``.pte``) come from the
artifact cache when their key matches. ``Pipeline.timings`` and ``Pipeline.sizes`` feed the main
job's per-stage table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from harness.cache import ArtifactCache, cache_key
from harness.errors import HarnessError
from harness.export import ExportSettings, export_program, make_wrapper
from harness.generate import Generation, greedy
from harness.load import LoadedModel, load_model
from harness.recipes import Recipe, get_recipe


@lru_cache(maxsize=4)
def shared_model(spec: str) -> LoadedModel:
    """One FP32 load per model spec per process; stages copy before they mutate."""
    return load_model(spec)


def eos_ids(loaded: LoadedModel) -> list[int]:
    ids: set[int] = set()
    for source in (loaded.model.generation_config, loaded.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is None:
            continue
        ids.update([eos] if isinstance(eos, int) else eos)
    tok = loaded.tokenizer
    if tok is not None:
        for name in ("<turn|>", "<end_of_turn>", "<eos>"):
            tid = tok.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != tok.unk_token_id:
                ids.add(tid)
    return sorted(ids)


def runner_metadata(loaded: LoadedModel, settings: ExportSettings, recipe: Recipe | None = None) -> dict:
    """Constant methods ExecuTorch's LLM runner reads, derived from the model, the export settings
    and the recipe (a ``fast`` recipe's program attends with llama::custom_sdpa on its own cache)."""
    cfg = loaded.config
    bos = getattr(cfg, "bos_token_id", None)
    if bos is None and loaded.tokenizer is not None:
        bos = loaded.tokenizer.bos_token_id
    return {
        "get_max_seq_len": settings.max_seq,
        "get_max_context_len": settings.max_context,
        "get_bos_id": int(bos if bos is not None else 2),
        "get_eos_ids": eos_ids(loaded),
        "get_vocab_size": int(cfg.vocab_size),
        "get_n_layers": int(cfg.num_hidden_layers),
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": recipe is not None and recipe.export == "fast",
        "enable_dynamic_shape": True,
    }


@dataclass
class StageRecord:
    seconds: float = 0.0
    bytes: int | None = None
    cached: bool = False


class Pipeline:
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

    # ---- stages -------------------------------------------------------------------------------
    @cached_property
    def loaded(self) -> LoadedModel:
        t0 = time.time()
        spec = self._model_spec
        loaded = spec if isinstance(spec, LoadedModel) else shared_model(str(spec))
        self.records["load"] = StageRecord(time.time() - t0, _param_bytes(loaded.model))
        return loaded

    @cached_property
    def quantized(self):
        """The recipe applied to a copy of the FP32 model (the FP32 model itself for ``fp32``)."""
        from harness.quantize import quantize

        t0 = time.time()
        model, self.quant_summary = quantize(self.loaded.model, self.recipe)
        model.requires_grad_(False)
        self.records["quantize"] = StageRecord(time.time() - t0, _param_bytes(model))
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

    @cached_property
    def pt2_path(self) -> Path:
        from harness.pt2 import save_pt2

        def build(path: Path):
            self.progress(f"exporting {self.loaded.name} [{self.recipe.name}] with torch.export ...")
            t0 = time.time()
            ep = export_program(self.quantized, self.settings)
            save_pt2(ep, path)
            return {"export_seconds": round(time.time() - t0, 2)}

        t0 = time.time()
        path = self.cache.get_or_build("pt2", self._key("pt2"), "program.pt2", build)
        hit = self.cache.events[-1][2] == "hit"
        self.records["export"] = StageRecord(time.time() - t0, path.stat().st_size, hit)
        return path

    @cached_property
    def exported(self):
        """The ExportedProgram, as reloaded from the verified ``.pt2`` (what users ship)."""
        from harness.pt2 import load_pt2

        if self.recipe.export == "fast":  # the program calls llama:: ops: register them first
            from harness.fast import load_custom_ops_for_export

            load_custom_ops_for_export()
        return load_pt2(self.pt2_path)

    @cached_property
    def pte_path(self) -> Path:
        from harness.lower import lower
        from harness.pte import write_pte

        def build(path: Path):
            self.progress(f"lowering {self.loaded.name} [{self.recipe.name}] to XNNPACK (minutes) ...")
            t0 = time.time()
            program, report = lower(self.exported, self.recipe,
                                    runner_metadata(self.loaded, self.settings, self.recipe))
            lower_s = time.time() - t0
            write_pte(program.buffer, path)
            return {"lower_seconds": round(lower_s, 2), "ops": report.as_dict()}

        t0 = time.time()
        path = self.cache.get_or_build("pte", self._key("pte"), "model.pte", build)
        hit = self.cache.events[-1][2] == "hit"
        self.records["lower+serialize"] = StageRecord(time.time() - t0, path.stat().st_size, hit)
        return path

    @property
    def lower_report(self) -> dict:
        self.pte_path
        return self.cache.meta("pte", self._key("pte")).get("ops", {})

    @cached_property
    def runner(self):
        from harness.pte import PteRunner

        path = self.pte_path
        t0 = time.time()
        r = PteRunner(path)
        self.records["run (load .pte)"] = StageRecord(time.time() - t0, None)
        return r

    # ---- step functions -----------------------------------------------------------------------
    def eager_step(self, quantized: bool = True):
        """A fresh eager wrapper (own KV cache) around the FP32 or the quantized model."""
        model = self.quantized if quantized else self.loaded.model
        wrapper = make_wrapper(model, self.settings)
        return lambda ids, pos: wrapper(input_ids=ids, cache_position=pos)

    def exported_step(self):
        module = self.exported.module()
        return lambda ids, pos: module(input_ids=ids, cache_position=pos)

    def pte_step(self):
        return self.runner.step

    def step(self, stage: str):
        if stage == "eager":
            return self.eager_step(quantized=True)
        if stage == "exported":
            return self.exported_step()
        if stage == "pte":
            return self.pte_step()
        raise HarnessError(f"unknown stage {stage!r}", "use eager, exported or pte")

    # ---- generation ---------------------------------------------------------------------------
    def prompt_ids(self, prompt: str) -> list[int]:
        return encode_prompt(self.loaded.tokenizer, prompt)

    def generate(self, prompt: str | list[int], stage: str = "pte", max_new_tokens: int = 9, **kw) -> Generation:
        ids = self.prompt_ids(prompt) if isinstance(prompt, str) else list(prompt)
        step = self.step(stage)  # loading the program is its own stage, not generation time
        t0 = time.time()
        gen = greedy(
            step,
            ids,
            max_new_tokens,
            eos_ids=frozenset(eos_ids(self.loaded)),
            max_context=self.settings.max_context,
            vocab_size=self.loaded.config.vocab_size,
            **kw,
        )
        self.records[f"generate ({stage})"] = StageRecord(time.time() - t0, None)
        return gen

    def hf_generate(self, prompt: str | list[int], max_new_tokens: int = 9, quantized: bool = False) -> list[int]:
        """Token ids from transformers' generate on the FP32 model (or the recipe's, if asked)."""
        return self.hf_run(prompt, max_new_tokens, quantized).ids

    def hf_run(self, prompt: str | list[int], max_new_tokens: int = 9, quantized: bool = False) -> Generation:
        """transformers' own ``generate`` (greedy) on the FP32 or the recipe's model, with logits."""
        import torch

        ids = self.prompt_ids(prompt) if isinstance(prompt, str) else list(prompt)
        model = self.quantized if quantized else self.loaded.model
        eos = eos_ids(self.loaded)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                eos_token_id=eos, pad_token_id=self.loaded.config.pad_token_id,
                output_logits=True, return_dict_in_generate=True,
            )
        new = out.sequences[0, len(ids):].tolist()
        return Generation(prompt_ids=ids, ids=new, step_logits=[l[0] for l in out.logits],
                          stopped_on_eos=bool(new) and new[-1] in eos)

    def run_stage(self, stage: str, prompt: str | list[int], max_new_tokens: int = 9) -> Generation:
        """One golden stage: ``hf_generate`` (transformers on this recipe's model), ``eager``
        (the export wrapper, eagerly), ``exported`` (the reloaded .pt2) or ``pte``."""
        if stage == "hf_generate":
            return self.hf_run(prompt, max_new_tokens, quantized=True)  # this recipe's model
        return self.generate(prompt, stage=stage, max_new_tokens=max_new_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.loaded.tokenizer.decode(ids, skip_special_tokens=True)


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Chat-template a user prompt (Gemma turn format) and tokenize it, specials included once."""
    if tokenizer is None:
        raise HarnessError("this model has no tokenizer", "pass token ids, or a model directory with tokenizer.json")
    if not prompt or not prompt.strip():
        raise HarnessError("empty prompt", "pass a non-empty --prompt")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def _param_bytes(model) -> int:
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
