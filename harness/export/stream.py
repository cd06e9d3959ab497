"""Load and quantize in one pass, tensor by tensor, for checkpoints too large to hold in FP32.

``load`` then ``quantize`` holds the whole FP32 model and a deep copy: for Gemma 4 E2B's 4.6B text
parameters that is 18.5 GB twice, which no laptop has. Here the model is built with its parameters
on PyTorch's meta device (buffers, such as the RoPE tables and embedding scales, are computed as
usual), then each module's tensors are read from the safetensors shards (memory-mapped), widened to
FP32 and quantized by the recipe before the next module is read. Only one module's FP32 weights
are alive at a time; the per-layer embedding table (2.35B parameters, 9.4 GB in FP32) is quantized
in blocks of rows, which its per-row scheme allows. The token table, tied to ``lm_head``, stays FP32
until both of its quantized uses are made from it, as in ``quantize``.

The result is the model ``quantize(load_directory(d), recipe)`` gives, tensor for tensor and bit for
bit (tests/test_stream_load.py holds it to that on the fixture, for every recipe), through torchao's
own configs: only the order differs, and each module's quantization depends on its weights alone.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

from harness.errors import HarnessError
from harness.recipes import Recipe

ROW_BLOCK = 16384  # rows of the per-layer table quantized at a time (16384 x 8960 FP32: 587 MB at E2B)
KEY_PREFIXES = ("model.language_model.", "language_model.model.")  # multimodal layouts → "model."


@contextmanager
def parameters_on_meta():
    """Modules built inside get their parameters on the meta device (no memory, no random
    initialisation); buffers stay real, so the model's own code computes them."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


class Checkpoint:
    """The tensors of a checkpoint directory by their text-decoder names (``model.*``). Each read
    opens its shard, copies the tensor out and closes it again: a shard kept open stays mapped,
    and every page read from it would stay in this process's resident set (9.3 GB at E2B)."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        self.directory = Path(directory)
        index = self.directory / "model.safetensors.index.json"
        shards = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file()
                  else sorted(p.name for p in self.directory.glob("*.safetensors")))
        self.where: dict[str, tuple[str, str]] = {}
        self.shapes: dict[str, list[int]] = {}
        for shard in shards:
            with safe_open(str(self.directory / shard), framework="pt") as f:
                for key in f.keys():
                    name = key
                    for prefix in KEY_PREFIXES:
                        if key.startswith(prefix):
                            name = "model." + key[len(prefix):]
                    self.where[name] = (shard, key)
                    self.shapes[name] = list(f.get_slice(key).get_shape())

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def shape(self, name: str) -> list[int]:
        return self.shapes[name]

    def get(self, name: str, rows: slice | None = None):
        """The tensor (or a block of its rows) widened to FP32, as ``from_pretrained(dtype=float32)``
        gives it, in memory of its own (nothing left mapped)."""
        import torch
        from safetensors import safe_open

        shard, key = self.where[name]
        with safe_open(str(self.directory / shard), framework="pt") as f:
            t = f.get_slice(key)[rows] if rows is not None else f.get_tensor(key)
            # a copy either way: the tensor safetensors returns is a view of the mapped file
            return t.to(torch.float32) if t.is_floating_point() and t.dtype != torch.float32 else t.clone()


def text_config(directory: Path):
    """The decoder's Gemma4TextConfig from a flat or multimodal ``config.json``, as the loader
    builds it (eager attention, FP32)."""
    import torch
    from transformers import Gemma4TextConfig

    raw = json.loads((Path(directory) / "config.json").read_text())
    cfg = dict(raw.get("text_config") or raw) if raw.get("model_type") == "gemma4" else dict(raw)
    if raw.get("model_type") not in ("gemma4", "gemma4_text"):
        raise HarnessError(f"{directory}/config.json has model_type {raw.get('model_type')!r}, not a Gemma 4 model",
                           "pass a Gemma 4 checkpoint (model_type gemma4 or gemma4_text)")
    for k in ("model_type", "architectures", "transformers_version"):
        cfg.pop(k, None)
    config = Gemma4TextConfig(**cfg)
    config._attn_implementation = "eager"
    config.dtype = torch.float32
    return config


def _set(module, name: str, tensor) -> None:
    import torch

    if name in module._parameters:
        module._parameters[name] = torch.nn.Parameter(tensor, requires_grad=False)
    else:
        module._buffers[name] = tensor


def _quantize_rows(ckpt: Checkpoint, name: str, block: int):
    """A per-row INT8 table quantized ``block`` rows at a time with torchao, its pieces joined into
    the one tensor torchao gives for the whole table (per-row scales make rows independent)."""
    import torch
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    rows, dim = ckpt.shape(name)
    parts = []
    for start in range(0, rows, block):
        emb = torch.nn.Embedding(min(block, rows - start), dim, _weight=ckpt.get(name, slice(start, start + block)))
        quantize_(torch.nn.Sequential(emb), IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
                  filter_fn=lambda m, fqn: m is emb)
        parts.append(emb.weight)
        del emb
    first = parts[0]
    joined = {n: torch.cat([getattr(p, n) for p in parts]) for n in first.tensor_data_names}
    del parts
    return type(first)(*(joined[n] for n in first.tensor_data_names),
                       *(getattr(first, a) for a in first.tensor_attribute_names))


def load_quantized(directory, recipe: Recipe, progress=None, row_block: int = ROW_BLOCK):
    """``(model, summary)``: the checkpoint at ``directory`` with ``recipe`` applied, read module by
    module. ``summary`` is ``quantize``'s, plus the seconds spent."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup
    from transformers import Gemma4ForCausalLM

    from harness.export.quantize import choose_group_size
    from harness.models.load import check_model_dir

    say = progress or (lambda m: None)
    t0 = time.time()
    directory = Path(directory)
    check_model_dir(directory)
    config = text_config(directory)
    ckpt = Checkpoint(directory)
    with parameters_on_meta():
        model = Gemma4ForCausalLM(config)
    model.eval()
    tied = bool(getattr(config, "tie_word_embeddings", True))
    group = choose_group_size(model, recipe) if recipe.linear or recipe.embedding else None
    summary: dict = {"recipe": recipe.name, "streamed": True}
    linear_config = (Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group))
                     if recipe.linear == "8da4w" else None)
    if recipe.linear not in (None, "8da4w"):
        raise HarnessError(f"recipe {recipe.name}: unknown linear scheme {recipe.linear}", "fix recipes.py")
    ple_name = "model.embed_tokens_per_layer.weight"
    persistent = set(model.state_dict().keys())
    wanted = persistent - ({"lm_head.weight"} if tied else set())
    missing = sorted(n for n in wanted if n not in ckpt)
    if missing:
        raise HarnessError(f"{directory} lacks {len(missing)} text-decoder tensors (e.g. {missing[0]})",
                           "pass a complete Gemma 4 checkpoint")
    modules = dict(model.named_modules())
    for mname, module in modules.items():
        own = [n for n in list(module._parameters) + list(module._buffers) if f"{mname}.{n}".lstrip(".") in wanted]
        if not own:
            continue
        for n in own:
            full = f"{mname}.{n}".lstrip(".")
            if full == ple_name and recipe.per_layer_embedding == "int8":
                module.padding_idx = None
                say(f"quantizing {full} {ckpt.shape(full)} INT8 per row, {row_block} rows at a time ...")
                _set(module, n, _quantize_rows(ckpt, full, row_block))
                summary["per_layer_embedding"] = "int8 per-row"
            else:
                want = module._parameters[n] if n in module._parameters else module._buffers[n]
                t = ckpt.get(full)
                if list(t.shape) != list(want.shape):
                    raise HarnessError(f"{directory}: {full} has shape {list(t.shape)}, the config needs "
                                       f"{list(want.shape)}", "pass a checkpoint that matches its config.json")
                _set(module, n, t)
        if linear_config is not None and isinstance(module, torch.nn.Linear) and mname != "lm_head":
            quantize_(module, linear_config, filter_fn=lambda m, fqn: m is module)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    if linear_config is not None:
        quantize_(model.lm_head, linear_config, filter_fn=lambda m, fqn: m is model.lm_head)
        summary["linear"] = f"8da4w group {group}"
        summary["group_size"] = group
    if recipe.embedding is not None:
        from harness.export.fast.embedding import quantize_embedding

        summary.update(quantize_embedding(model, recipe.embedding, group))
    left = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if left:
        raise HarnessError(f"{directory}: {len(left)} tensors were not loaded (e.g. {left[0]})",
                           "pass a complete Gemma 4 checkpoint")
    model.requires_grad_(False)
    summary["seconds"] = round(time.time() - t0, 1)
    return model, summary
