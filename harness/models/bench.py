"""The benchmark-size model: a Gemma 4 text config (``harness/models/configs/bench.json``, 70.5M
parameters: 12 layers, hidden 512, vocab 8192, 4 KV-shared layers, sliding window 64) with random
weights from a fixed seed, materialised once as an ordinary Hugging Face checkpoint directory in
the artifact cache, so that every runtime (transformers, ExecuTorch, llama.cpp's GGUF converter)
reads the very same weights and tokenizer.

The tokenizer is the fixture's (Gemma-style byte-fallback BPE, same special tokens) padded to the
config's vocabulary with ``<unused_N>`` entries: llama.cpp requires the tokenizer's vocabulary to
equal the model's. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.cache import ArtifactCache, cache_key
from harness.errors import HarnessError
from harness.models.load import ATTN_IMPLEMENTATION, FIXTURE_DIR

BENCH_CONFIG = Path(__file__).resolve().parent / "configs" / "bench.json"
BENCH_SEED = 0
_TOKENIZER_FILES = ("tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def padded_tokenizer(vocab_size: int) -> dict:
    """The fixture's tokenizer.json with ``<unused_N>`` entries up to ``vocab_size``."""
    spec = json.loads((FIXTURE_DIR / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    used = set(vocab.values()) | {t["id"] for t in spec.get("added_tokens", [])}
    if max(used) >= vocab_size:
        raise HarnessError(f"vocab_size {vocab_size} is smaller than the fixture tokenizer's",
                           "use a vocab_size of at least 1024")
    for i in range(vocab_size):
        if i not in used:
            vocab[f"<unused_{i}>"] = i
    return spec


def write_model_dir(config: dict, seed: int, out: Path) -> None:
    """Random seeded weights for ``config`` plus the padded fixture tokenizer, as an HF directory."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = Gemma4TextConfig(**config)
    cfg._attn_implementation = ATTN_IMPLEMENTATION
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(cfg).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "tokenizer.json").write_text(json.dumps(padded_tokenizer(cfg.vocab_size), ensure_ascii=False))
    for name in _TOKENIZER_FILES:
        shutil.copyfile(FIXTURE_DIR / name, out / name)


def bench_model_dir(config_path: Path = BENCH_CONFIG, seed: int = BENCH_SEED,
                    cache: ArtifactCache | None = None) -> Path:
    """The cached checkpoint directory of the benchmark model (built on first use, ~10 s)."""
    config = json.loads(Path(config_path).read_text())
    cache = cache or ArtifactCache()
    key = cache_key("benchmodel", config=config, seed=seed)
    path = cache.get_or_build("benchmodel", key, "model.safetensors",
                              lambda p: write_model_dir(config, seed, p.parent) or {"seed": seed})
    return path.parent
