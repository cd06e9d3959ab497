"""The whole pipeline a test or a user drives: the build (harness/export/pipeline.py: load →
quantize → export → lower → serialize, cached) and the runs of its artifacts, each through its
runtime (harness/runtimes): ``eager`` (the recipe's model, through the wrapper that is exported),
``exported`` (the reloaded ``.pt2``), ``pte`` (the ``.pte`` through ExecuTorch's Python runtime),
and transformers' own ``generate`` as the reference. Kept out of harness/export so that editing how
models are run never invalidates a cached artifact.
"""

from __future__ import annotations

import time
from functools import cached_property

from harness.export.pipeline import BuildPipeline, StageRecord
from harness.errors import HarnessError
from harness.program import eos_ids
from harness.runtimes.base import Generation, Runtime

STAGES = ("eager", "exported", "pte")


class Pipeline(BuildPipeline):
    @cached_property
    def runner(self) -> Runtime:
        """The ``.pte`` loaded once in ExecuTorch's Python runtime (its load is a stage of its own)."""
        from harness.runtimes.executorch import PteRuntime

        path = self.pte_path
        t0 = time.time()
        r = PteRuntime(path)
        self.records["run (load .pte)"] = StageRecord(time.time() - t0, None)
        return r

    # ---- runtimes -----------------------------------------------------------------------------
    def runtime(self, stage: str, quantized: bool = True) -> Runtime:
        """A runtime on this pipeline's artifact of ``stage``; ``eager`` and ``exported`` are fresh
        (own KV cache) each time, ``pte`` is the one loaded program."""
        if stage == "eager":
            from harness.runtimes.pytorch import EagerRuntime

            model = self.quantized if quantized else self.fp32_model
            return EagerRuntime(model, settings=self.settings, export=self.recipe.export if quantized else "hf")
        if stage == "exported":
            from harness.runtimes.pytorch import ExportedRuntime

            return ExportedRuntime(self.exported, settings=self.settings)
        if stage == "pte":
            return self.runner
        raise HarnessError(f"unknown stage {stage!r}", f"use one of {', '.join(STAGES)}")

    def step(self, stage: str):
        return self.runtime(stage).step

    def eager_step(self, quantized: bool = True):
        """A fresh eager runtime's step (own KV cache), the recipe's model or the FP32 one."""
        return self.runtime("eager", quantized).step

    def exported_step(self):
        return self.runtime("exported").step

    def pte_step(self):
        return self.runtime("pte").step

    # ---- generation ---------------------------------------------------------------------------
    def prompt_ids(self, prompt: str) -> list[int]:
        return encode_prompt(self.loaded.tokenizer, prompt)

    def generate(self, prompt: str | list[int], stage: str = "pte", max_new_tokens: int = 9, **kw) -> Generation:
        ids = self.prompt_ids(prompt) if isinstance(prompt, str) else list(prompt)
        runtime = self.runtime(stage)  # loading the program is its own stage, not generation time
        runtime.max_context, runtime.vocab_size = self.settings.max_context, int(self.loaded.config.vocab_size)
        t0 = time.time()
        gen = runtime.generate(ids, max_new_tokens, eos_ids=eos_ids(self.loaded), **kw)
        self.records[f"generate ({stage})"] = StageRecord(time.time() - t0, None)
        return gen

    def hf_generate(self, prompt: str | list[int], max_new_tokens: int = 9, quantized: bool = False) -> list[int]:
        """Token ids from transformers' generate on the FP32 model (or the recipe's, if asked)."""
        return self.hf_run(prompt, max_new_tokens, quantized).ids

    def hf_run(self, prompt: str | list[int], max_new_tokens: int = 9, quantized: bool = False) -> Generation:
        """transformers' own ``generate`` (greedy) on the FP32 or the recipe's model, with logits:
        the reference every runtime is held to (its own loop, not ours)."""
        ids = self.prompt_ids(prompt) if isinstance(prompt, str) else list(prompt)
        model = self.quantized if quantized else self.fp32_model
        return transformers_generate(model, self.loaded, ids, max_new_tokens)

    def run_stage(self, stage: str, prompt: str | list[int], max_new_tokens: int = 9) -> Generation:
        """One golden stage: ``hf_generate`` (transformers on this recipe's model), ``eager``
        (the export wrapper, eagerly), ``exported`` (the reloaded .pt2) or ``pte``."""
        if stage == "hf_generate":
            return self.hf_run(prompt, max_new_tokens, quantized=True)  # this recipe's model
        return self.generate(prompt, stage=stage, max_new_tokens=max_new_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.loaded.tokenizer.decode(ids, skip_special_tokens=True)


def transformers_generate(model, loaded, ids: list[int], max_new_tokens: int) -> Generation:
    """transformers' ``generate`` (greedy, its own loop and cache) with every step's logits, in
    float32 whatever the model's dtype."""
    import torch

    eos = eos_ids(loaded)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=eos, pad_token_id=loaded.config.pad_token_id,
            output_logits=True, return_dict_in_generate=True,
        )
    new = out.sequences[0, len(ids):].tolist()
    return Generation(prompt_ids=ids, ids=new, step_logits=[l[0].float() for l in out.logits],
                      stopped_on_eos=bool(new) and new[-1] in eos)


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
