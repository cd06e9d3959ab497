"""The committed fixture keeps every Gemma 4 E2B feature that export and quantization trip on."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch

from support import FIXTURE_DIR, corpus
from harness.export.pipeline import shared_model
from harness.pipeline import encode_prompt

pytestmark = pytest.mark.mac


@pytest.fixture(scope="module")
def fx():
    return shared_model("fixture")


def test_fixture_fits_in_10_mb():
    total = sum(p.stat().st_size for p in FIXTURE_DIR.iterdir() if p.is_file())
    assert total <= 10 * 1024 * 1024, f"fixture is {total / 1e6:.2f} MB, budget 10 MiB"


def test_weights_hash_matches_model_card():
    card = (FIXTURE_DIR / "MODEL_CARD.md").read_text()
    recorded = re.search(r"sha256 `([0-9a-f]{64})`", card).group(1)
    actual = hashlib.sha256((FIXTURE_DIR / "model.safetensors").read_bytes()).hexdigest()
    assert actual == recorded, "model.safetensors changed without MODEL_CARD.md (retrain with harness.training.fixture)"


def test_fixture_keeps_e2b_architecture(fx):
    cfg, m = fx.config, fx.model
    inner = m.model
    # per-layer input embeddings, their projection and norm
    for name in ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm"):
        assert hasattr(inner, name), name
    assert cfg.hidden_size_per_layer_input > 0
    # sliding and full attention alternate; full layers have the larger head size
    assert {"sliding_attention", "full_attention"} == set(cfg.layer_types)
    head_dims = {t: {layer.self_attn.head_dim for layer, lt in zip(inner.layers, cfg.layer_types) if lt == t}
                 for t in set(cfg.layer_types)}
    assert min(head_dims["full_attention"]) > max(head_dims["sliding_attention"]), head_dims
    # one KV head (GQA)
    assert cfg.num_key_value_heads == 1 and cfg.num_attention_heads > 1
    # KV sharing across the last layers; as in E2B the last producer is full, the one before sliding
    assert cfg.num_kv_shared_layers > 0
    first_shared = cfg.num_hidden_layers - cfg.num_kv_shared_layers
    assert cfg.layer_types[first_shared - 1] == "full_attention"
    assert cfg.layer_types[first_shared - 2] == "sliding_attention"
    assert cfg.final_logit_softcapping == 30.0
    assert cfg.tie_word_embeddings and m.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr()
    assert cfg.hidden_activation == "gelu_pytorch_tanh"


def test_every_quantized_dim_is_a_multiple_of_32(fx):
    dims = {}
    for name, mod in fx.model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            dims[name] = (mod.in_features, mod.out_features)
    bad = {k: v for k, v in dims.items() if v[0] % 32 or v[1] % 32}
    assert not bad, f"linear dims not multiples of 32: {bad}"
    ple = fx.model.model.embed_tokens_per_layer.weight
    assert ple.shape[0] % 32 == 0 and ple.shape[1] % 32 == 0, ple.shape


def test_tokenizer_is_gemma_style_and_matches_vocab(fx):
    spec = json.loads((FIXTURE_DIR / "tokenizer.json").read_text())
    assert spec["model"]["type"] == "BPE" and spec["model"]["byte_fallback"] is True
    assert [d["type"] for d in spec["decoder"]["decoders"]] == ["Replace", "ByteFallback", "Fuse"]
    assert len(spec["model"]["vocab"]) == fx.config.vocab_size
    ids = encode_prompt(fx.tokenizer, "What is the capital of France?")
    assert ids[0] == fx.config.bos_token_id and ids.count(fx.config.bos_token_id) == 1


@pytest.mark.parametrize("row", corpus(), ids=lambda r: r["prompt"][:40])
def test_fixture_answers_its_corpus_with_clear_margins(fx, row):
    ids = encode_prompt(fx.tokenizer, row["prompt"])
    with torch.no_grad():
        out = fx.model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, len(ids):].tolist()
    assert fx.tokenizer.decode(new, skip_special_tokens=True) == row["answer"]
    margins = [float(l[0].topk(2).values[0] - l[0].topk(2).values[1]) for l in out.logits]
    assert min(margins) >= 4.0, f"top-1 margins {margins} too small: INT4 could flip a token"
