"""What a model is made of, without loading it: parameter counts by kind (all, linear weights, the
per-layer embedding table), from a checkpoint's safetensors headers (no weight is read, and a cut
or damaged shard is named here) or from a config built on PyTorch's meta device. The memory
pre-flight (harness/export/preflight.py) and the disk estimate start from these counts.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.recipes import Recipe

MiB = 1 << 20


@dataclass(frozen=True)
class ModelSize:
    """Parameter counts by kind (tied weights once), as the loaded FP32 model will hold them."""

    name: str
    params: int
    linear: int  # weights of nn.Linear layers: INT4 per group under 8da4w
    per_layer_embedding: int  # embed_tokens_per_layer: INT8 per row under 8da4w
    source: str  # how it was counted

    @property
    def fp32_bytes(self) -> int:
        return 4 * self.params

    def quantized_bytes(self, recipe: Recipe) -> int:
        """Bytes after the recipe, in memory (torchao keeps INT4 codes unpacked, one per byte,
        with an FP32 scale and an INT8 zero point per group of at most 128)."""
        if recipe.linear is None and recipe.per_layer_embedding is None:
            return self.fp32_bytes
        rest = self.params
        total = 0
        if recipe.linear == "8da4w":
            total += int(self.linear * (1 + 5 / (recipe.group_size or 32)))
            rest -= self.linear
        if recipe.per_layer_embedding == "int8":
            total += self.per_layer_embedding
            rest -= self.per_layer_embedding
        return total + 4 * rest


_TEXT_PREFIXES = ("model.language_model.", "language_model.model.")
_LINEAR_SUFFIXES = (
    "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
    "up_proj.weight", "down_proj.weight", "per_layer_input_gate.weight", "per_layer_projection.weight",
    "per_layer_model_projection.weight",
)


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes, offsets), checked
    against the file's size: a cut copy is named here, before any weight is read."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HarnessError(f"{path} is not a safetensors file ({size} bytes, shorter than its header)",
                               "copy the checkpoint again")
        (n,) = struct.unpack("<Q", head)
        if n < 2 or n > size - 8 or n > 100 * MiB:
            raise HarnessError(f"{path} is not a safetensors file (its header length {n} does not fit "
                               f"a {size}-byte file)", "copy the checkpoint again")
        blob = f.read(n)
    try:
        header = json.loads(blob)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        raise HarnessError(f"{path} has a damaged safetensors header ({type(e).__name__})",
                           "copy the checkpoint again") from None
    if ends and 8 + n + max(ends) > size:
        raise HarnessError(
            f"{path} is truncated: its header describes {8 + n + max(ends)} bytes, the file has {size}",
            "finish copying the checkpoint",
        )
    return header


def size_from_directory(directory: Path, name: str | None = None) -> ModelSize:
    """Count the text decoder's parameters from the safetensors headers (no weight is read)."""
    from harness.models.load import check_model_dir

    directory = Path(directory)
    check_model_dir(directory)
    try:
        raw = json.loads((directory / "config.json").read_text())
    except ValueError as e:
        raise HarnessError(f"{directory}/config.json is not valid JSON ({e})", "copy the checkpoint again") from None
    if not isinstance(raw, dict) or raw.get("model_type") not in ("gemma4", "gemma4_text"):
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        raise HarnessError(  # the loader's own words, before any shard is read
            f"{directory}/config.json has model_type {model_type!r}, not a Gemma 4 model",
            "pass a Gemma 4 checkpoint (model_type gemma4 or gemma4_text)",
        )
    multimodal = raw.get("model_type") == "gemma4"
    tied = (raw.get("text_config") or {}).get("tie_word_embeddings", raw.get("tie_word_embeddings", True))
    params = linear = ple = 0
    for shard in sorted(directory.glob("*.safetensors")):
        for key, info in read_safetensors_header(shard).items():
            if key == "__metadata__":
                continue
            if multimodal:
                prefix = next((p for p in _TEXT_PREFIXES if key.startswith(p)), None)
                if prefix is None:
                    continue  # vision / audio towers: not loaded
                key = "model." + key[len(prefix):]
            if key == "lm_head.weight" and tied:
                continue
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            params += count
            if key.endswith(_LINEAR_SUFFIXES) or key == "lm_head.weight":
                linear += count
            elif "embed_tokens_per_layer" in key:
                ple += count
    return ModelSize(name or str(directory), params, linear, ple, "safetensors headers")


def size_from_config(config: dict, name: str) -> ModelSize:
    """Count parameters by building the model on PyTorch's meta device (no memory for weights)."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    try:
        cfg = Gemma4TextConfig(**config)
        with torch.device("meta"):
            model = Gemma4ForCausalLM(cfg)
    except Exception as e:
        raise HarnessError(f"config {name} is not a valid Gemma4TextConfig ({type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0][:120]})", "fix the config") from None
    return ModelSize(name, *count_params(model), "config on the meta device")


def model_size(spec) -> ModelSize:
    """``fixture``, ``bench``, ``FILE.json``, a checkpoint directory (harness.models.spec), or an
    already loaded model."""
    from harness.models.load import LoadedModel
    from harness.models.spec import resolve

    if isinstance(spec, LoadedModel):
        return size_from_loaded(spec)
    resolved = resolve(spec)
    if resolved.kind == "config":
        return size_from_config(resolved.config(), resolved.name.removeprefix("config:"))
    return size_from_directory(resolved.path, resolved.name if resolved.kind == "fixture" else None)


def size_from_loaded(loaded) -> ModelSize:
    return ModelSize(loaded.name, *count_params(loaded.model), "the loaded model")


def count_params(model) -> tuple[int, int, int]:
    """(all parameters, those in linears, those in the per-layer embedding); tied weights once."""
    import torch

    params = linear = ple = 0
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            params += p.numel()
            if isinstance(module, torch.nn.Linear):
                linear += p.numel()
            elif mod_name.endswith("embed_tokens_per_layer"):
                ple += p.numel()
    return params, linear, ple
