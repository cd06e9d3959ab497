"""Load stage: the committed fixture, a config-only model with seeded random weights, or a local
checkpoint directory (including a real Gemma 4 E2B snapshot, text decoder only). Nothing downloads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cache import sha256_file
from harness.errors import HarnessError

FIXTURE_DIR = Path(__file__).resolve().parent / "fixture"
ATTN_IMPLEMENTATION = "eager"  # bit-exact eager vs exported; see docs/architecture.md, "Why eager attention"


@dataclass
class LoadedModel:
    model: Any  # transformers Gemma4ForCausalLM, eval mode, FP32
    tokenizer: Any  # transformers tokenizer (may be None for config-only models)
    name: str  # "fixture", "config:<name>", or the directory
    identity: str  # hash of what determines the weights (cache key component)
    directory: Path | None = None
    meta: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    def param_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _dir_identity(directory: Path) -> str:
    """sha256 over every file's name and full content, each file read once and then remembered by
    its stat (harness/models/identity.py)."""
    from harness.models.identity import content_hash

    return content_hash(directory)


def no_hub_kernels() -> dict:
    """``from_pretrained`` keyword arguments that keep transformers' hub kernels off: 5.25 turns an
    absent ``use_kernels`` into True (unless USE_HUB_KERNELS=0, which harness/__init__.py sets too),
    which replaces layers with kernels downloaded at run time. Only for a transformers that has them
    (``PreTrainedModel.set_use_kernels``); an older one would pass the word on to the config."""
    from transformers import PreTrainedModel

    return {"use_kernels": False} if hasattr(PreTrainedModel, "set_use_kernels") else {}


def drop_fusion_config(config) -> list[str]:
    """transformers 5.24+ registers "fusion patches" (other modules than the stock ones) from a
    ``fusion_config`` in the checkpoint's config.json; the harness guards the stock modules, so it
    drops one and says so in ``LoadedModel.meta`` (what it dropped)."""
    fusion = getattr(config, "fusion_config", None)
    if not fusion:
        return []
    config.__dict__.pop("fusion_config", None)
    if getattr(config, "fusion_config", None):
        config.fusion_config = None
    return sorted(fusion) if isinstance(fusion, dict) else [str(fusion)]


def _load_tokenizer(directory: Path):
    from transformers import AutoTokenizer

    if not (directory / "tokenizer.json").is_file():
        raise HarnessError(
            f"model directory {directory} has no tokenizer.json",
            "copy the checkpoint's tokenizer files (tokenizer.json, tokenizer_config.json) into it",
        )
    return AutoTokenizer.from_pretrained(str(directory))


def check_model_dir(directory: Path) -> None:
    """Raise a one-line HarnessError unless ``directory`` looks like a complete HF checkpoint."""
    if not directory.exists():
        raise HarnessError(
            f"model directory {directory} does not exist",
            "pass --model fixture, or a local Hugging Face snapshot directory (nothing is downloaded)",
        )
    if not directory.is_dir():
        raise HarnessError(f"{directory} is not a directory", "pass the snapshot directory, not a file")
    if not (directory / "config.json").is_file():
        raise HarnessError(
            f"model directory {directory} has no config.json",
            "point --model at the snapshot root that holds config.json and *.safetensors",
        )
    weights = list(directory.glob("*.safetensors"))
    if not weights:
        raise HarnessError(
            f"model directory {directory} has no *.safetensors weights",
            "copy the complete checkpoint (all safetensors shards) into it",
        )
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = set(json.loads(index.read_text())["weight_map"].values())
        missing = sorted(s for s in shards if not (directory / s).is_file())
        if missing:
            raise HarnessError(
                f"model directory {directory} is incomplete: missing shard(s) {', '.join(missing)}",
                "finish copying the checkpoint",
            )


def load_fixture(directory: Path = FIXTURE_DIR) -> LoadedModel:
    """The committed, trained tiny Gemma 4 (see harness/models/fixture/MODEL_CARD.md)."""
    return load_directory(directory, name="fixture", identity=sha256_file(directory / "model.safetensors"))


def checkpoint_dtype(directory: Path) -> str:
    """The dtype the checkpoint's config says its weights are in (``bfloat16`` for Gemma 4)."""
    raw = json.loads((Path(directory) / "config.json").read_text())
    text = raw.get("text_config") or {}
    return str(text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype") or "float32")


def load_directory(directory: Path, name: str | None = None, identity: str | None = None,
                   dtype: str = "float32") -> LoadedModel:
    """A local checkpoint: a Gemma4ForCausalLM directory, or a full Gemma 4 (multimodal) snapshot
    whose text decoder is extracted without loading the vision/audio towers. In FP32 unless
    ``dtype`` says otherwise (the reference stage of a large checkpoint runs in its own bf16)."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    directory = Path(directory)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise HarnessError(f"{directory}: unknown weight dtype {dtype!r}", "pass float32, bfloat16 or float16")
    check_model_dir(directory)
    raw = json.loads((directory / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type == "gemma4_text":
        config = Gemma4TextConfig.from_pretrained(str(directory))
        dropped = drop_fusion_config(config)
        model = Gemma4ForCausalLM.from_pretrained(
            str(directory), config=config, dtype=torch_dtype, attn_implementation=ATTN_IMPLEMENTATION,
            **no_hub_kernels(),
        )
    elif model_type == "gemma4":
        model, dropped = _load_text_decoder_from_multimodal(directory, raw, Gemma4TextConfig, Gemma4ForCausalLM,
                                                            torch_dtype)
    else:
        raise HarnessError(
            f"{directory}/config.json has model_type {model_type!r}, not a Gemma 4 model",
            "pass a Gemma 4 checkpoint (model_type gemma4 or gemma4_text)",
        )
    model.eval()
    tokenizer = _load_tokenizer(directory)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name or str(directory),
        identity=identity or _dir_identity(directory),
        directory=directory,
        meta={"dropped_fusion_config": dropped} if dropped else {},
    )


def load_directory_meta(directory, model, **meta) -> LoadedModel:
    """A ``LoadedModel`` around a model built elsewhere from ``directory`` (the streaming quantized
    load): the directory's tokenizer, identity and generation config, and ``meta`` saying how."""
    from transformers import GenerationConfig

    directory = Path(directory)
    if (directory / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(directory))
    return LoadedModel(model=model, tokenizer=_load_tokenizer(directory), name=str(directory),
                       identity=_dir_identity(directory), directory=directory, meta=dict(meta))


def _load_text_decoder_from_multimodal(directory: Path, raw: dict, config_cls, model_cls, torch_dtype=None):
    """The text decoder of a multimodal snapshot (``model.language_model.*``, or the older
    ``language_model.model.*``), through transformers' own loader with a key mapping: it reads the
    shards lazily, materialises the non-persistent buffers (RoPE tables, embedding scales) that a
    meta-device build leaves empty, and skips the vision and audio towers. A text tensor it cannot
    find is refused rather than left randomly initialised."""
    import torch

    text_cfg = dict(raw.get("text_config") or {})
    if not text_cfg:
        raise HarnessError(
            f"{directory}/config.json has no text_config", "pass a Gemma 4 snapshot with a text decoder"
        )
    text_cfg.pop("model_type", None)
    if raw.get("fusion_config"):
        text_cfg.setdefault("fusion_config", raw["fusion_config"])
    config = config_cls(**text_cfg)
    dropped = drop_fusion_config(config)
    model, info = model_cls.from_pretrained(
        str(directory), config=config, dtype=torch_dtype or torch.float32, attn_implementation=ATTN_IMPLEMENTATION,
        **no_hub_kernels(),
        key_mapping={r"^model\.language_model\.": "model.", r"^language_model\.model\.": "model."},
        output_loading_info=True,
    )
    tied = bool(getattr(config, "tie_word_embeddings", True))
    missing = sorted(set(info.get("missing_keys") or ()) - ({"lm_head.weight"} if tied else set()))
    if missing:
        raise HarnessError(
            f"{directory} lacks {len(missing)} text-decoder tensors (e.g. {missing[0]})",
            "pass a complete Gemma 4 checkpoint",
        )
    for name, buf in list(model.named_buffers()):
        if buf.is_meta:
            raise HarnessError(f"buffer {name} was not initialised", "report this checkpoint layout")
    return model, dropped


def read_config_file(path: Path) -> dict:
    """A Gemma4TextConfig JSON file, or a one-line HarnessError saying what is wrong with it."""
    if not path.is_file():
        raise HarnessError(f"config file {path} does not exist", "pass an existing Gemma4TextConfig JSON")
    try:
        config = json.loads(path.read_text())
    except ValueError as e:
        raise HarnessError(f"config file {path} is not valid JSON ({e})", "fix the file") from None
    if not isinstance(config, dict):
        raise HarnessError(f"config file {path} is not a JSON object", "pass a Gemma4TextConfig JSON")
    return config
