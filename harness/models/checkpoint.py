"""Write a checkpoint directory in the layout of a real Gemma 4 snapshot: the multimodal wrapper's
``config.json`` (``model_type: gemma4``, the decoder under ``text_config``), the text tensors under
their real names (``model.language_model.*``), several safetensors shards named
``model-0000i-of-0000n.safetensors`` and their ``model.safetensors.index.json``, and the tokenizer
files beside them.

Tensors arrive one at a time from an iterator and each shard is written as soon as it is full, so
a model never has to be in memory whole. The directory is built beside its destination and renamed
into place only after every shard has been read back (names, shapes and dtypes against the index):
an interrupted write leaves nothing that looks like a checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

from harness.errors import HarnessError

TEXT_PREFIX = "model.language_model."
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def multimodal_config(text_config: dict, dtype: str) -> dict:
    """The wrapper config of a Gemma 4 snapshot around ``text_config`` (vision and audio towers
    are not written: the harness runs the text path, and the loader skips their tensors)."""
    text = dict(text_config)
    text.pop("architectures", None)
    text["model_type"] = "gemma4_text"
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "dtype": dtype,
            "text_config": text, "tie_word_embeddings": bool(text.get("tie_word_embeddings", True))}


def _shards(tensors: Iterable, shard_bytes: int) -> Iterator[dict]:
    shard: dict = {}
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > shard_bytes:
            yield shard
            shard, size = {}, 0
        shard[name] = tensor.contiguous()
        size += nbytes
    if shard:
        yield shard


def write_checkpoint(out: Path, text_config: dict, tensors: Iterable, tokenizer_dir: Path,
                     shard_bytes: int = 2 << 30, dtype: str = "bfloat16") -> Path:
    """``tensors``: ``(name, tensor)`` pairs under their checkpoint names (``model.language_model.*``),
    already in the dtype to store. Returns ``out``; refuses to overwrite a non-empty directory."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise HarnessError(f"{out} exists and is not empty", "pass a new directory, or remove it first")
    if shard_bytes < 1:
        raise HarnessError(f"shard size {shard_bytes} is not positive", "pass a positive shard size")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        written: list[tuple[str, dict]] = []  # (temporary name, {tensor name: (dtype, shape)})
        total = 0
        for i, shard in enumerate(_shards(tensors, shard_bytes)):
            name = f"part-{i:05d}.safetensors"
            save_file(shard, str(tmp / name), metadata={"format": "pt"})
            written.append((name, {k: (str(v.dtype), list(v.shape)) for k, v in shard.items()}))
            total += sum(v.numel() * v.element_size() for v in shard.values())
            del shard
        if not written:
            raise HarnessError("no tensors to write", "pass the model's tensors")
        n = len(written)
        weight_map = {}
        for i, (name, entries) in enumerate(written):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            (tmp / name).rename(tmp / final)
            with safe_open(str(tmp / final), framework="pt") as f:  # read back: names, dtypes, shapes
                for key, (dt, shape) in entries.items():
                    t = f.get_slice(key)
                    if list(t.get_shape()) != shape:
                        raise HarnessError(f"{final}: {key} reads back as {t.get_shape()}, wrote {shape}",
                                           "check the disk and write the checkpoint again")
                    weight_map[key] = final
                if set(f.keys()) != set(entries):
                    raise HarnessError(f"{final} does not hold the tensors written to it", "write it again")
        (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                            indent=1, sort_keys=True) + "\n")
        (tmp / "config.json").write_text(json.dumps(multimodal_config(text_config, dtype), indent=1) + "\n")
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                shutil.copyfile(Path(tokenizer_dir) / name, tmp / name)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def resave_multimodal(src: Path, out: Path, shard_bytes: int, extra: dict | None = None) -> Path:
    """A flat ``gemma4_text`` checkpoint (the fixture) re-saved in the snapshot layout, every tensor
    under ``model.language_model.`` in its own dtype; ``extra`` adds tensors of other towers
    (``model.vision_tower.*``), which the loader must skip."""
    from safetensors import safe_open

    src = Path(src)
    config = json.loads((src / "config.json").read_text())

    def tensors():
        for shard in sorted(src.glob("*.safetensors")):
            with safe_open(str(shard), framework="pt") as f:
                for key in f.keys():
                    if key == "lm_head.weight" and config.get("tie_word_embeddings", True):
                        continue
                    name = TEXT_PREFIX + key[len("model."):] if key.startswith("model.") else key
                    yield name, f.get_tensor(key)
        yield from (extra or {}).items()

    return write_checkpoint(out, config, tensors(), src, shard_bytes,
                            dtype=str(config.get("dtype") or config.get("torch_dtype") or "float32"))
