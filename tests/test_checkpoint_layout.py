"""The real checkpoint's layout, on the fixture: Gemma 4 E2B ships as a multimodal snapshot (the
decoder under ``text_config``, its tensors under ``model.language_model.*``, several shards and an
index, vision and audio towers beside it). The fixture re-saved that way must load to the very same
weights and say its goldens; a snapshot that lacks a text tensor, or names them otherwise, must be
refused in one line; an interrupted write must leave nothing behind."""

from __future__ import annotations

import json

import pytest

from harness.errors import HarnessError
from harness.models.checkpoint import INDEX, TEXT_PREFIX, resave_multimodal, write_checkpoint
from harness.models.load import FIXTURE_DIR, load_fixture
from harness.models.spec import load_model
from support import FIXTURE_PROMPTS

pytestmark = pytest.mark.mac

SHARD_BYTES = 1 << 20  # the fixture's 6 MB in several shards


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    import torch

    out = tmp_path_factory.mktemp("layout") / "gemma-4-fixture-it"
    vision = {"model.vision_tower.patch_embedder.input_proj.weight": torch.ones(4, 4)}
    return resave_multimodal(FIXTURE_DIR, out, SHARD_BYTES, extra=vision)


def test_the_snapshot_has_the_real_layout(snapshot):
    config = json.loads((snapshot / "config.json").read_text())
    assert config["model_type"] == "gemma4" and config["text_config"]["model_type"] == "gemma4_text"
    index = json.loads((snapshot / INDEX).read_text())
    shards = sorted(p.name for p in snapshot.glob("*.safetensors"))
    assert len(shards) >= 3 and shards[-1] == f"model-{len(shards):05d}-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"].values()) == set(shards)
    text = [k for k in index["weight_map"] if k.startswith(TEXT_PREFIX)]
    assert len(text) == 101 and "model.vision_tower.patch_embedder.input_proj.weight" in index["weight_map"]
    assert not list(snapshot.parent.glob(".*partial*"))


def test_the_multimodal_loader_gives_the_fixtures_weights_exactly(snapshot):
    import torch

    ours, theirs = load_model(str(snapshot)).model, load_fixture().model
    a, b = ours.state_dict(), theirs.state_dict()
    assert set(a) == set(b)
    different = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not different, f"loaded from the snapshot layout, these differ from the fixture: {different[:5]}"
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()  # still tied
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "sliding_window", "vocab_size",
                "final_logit_softcapping", "hidden_size_per_layer_input"):
        assert getattr(ours.config, key) == getattr(theirs.config, key), key


def test_the_snapshot_says_the_fixture_goldens(snapshot):
    from harness.goldens.store import golden_ids
    from harness.pipeline import Pipeline

    p = Pipeline(str(snapshot), "fp32")
    for prompt in FIXTURE_PROMPTS[:2]:
        assert p.generate(prompt, stage="eager").ids == golden_ids("fp32", "eager", prompt)


def test_a_snapshot_missing_a_text_tensor_is_refused_in_one_line(tmp_path):
    from safetensors import safe_open

    def all_but_one():
        with safe_open(str(FIXTURE_DIR / "model.safetensors"), framework="pt") as f:
            for key in f.keys():
                if key != "model.layers.1.mlp.up_proj.weight":
                    yield TEXT_PREFIX + key[len("model."):], f.get_tensor(key)

    cfg = json.loads((FIXTURE_DIR / "config.json").read_text())
    broken = write_checkpoint(tmp_path / "broken", cfg, all_but_one(), FIXTURE_DIR, SHARD_BYTES, "float32")
    with pytest.raises(HarnessError, match="lacks 1 text-decoder tensors .*model.layers.1.mlp.up_proj.weight") as err:
        load_model(str(broken))
    assert "\n" not in str(err.value)


def test_a_snapshot_under_other_names_is_refused(tmp_path):
    from safetensors import safe_open

    def renamed():
        with safe_open(str(FIXTURE_DIR / "model.safetensors"), framework="pt") as f:
            for key in f.keys():
                yield "model.text_model." + key[len("model."):], f.get_tensor(key)

    cfg = json.loads((FIXTURE_DIR / "config.json").read_text())
    other = write_checkpoint(tmp_path / "other", cfg, renamed(), FIXTURE_DIR, SHARD_BYTES, "float32")
    with pytest.raises(HarnessError, match="lacks 101 text-decoder tensors"):
        load_model(str(other))


def test_an_interrupted_write_leaves_nothing(tmp_path):
    import torch

    def dies():
        yield "model.language_model.a", torch.zeros(1 << 18)
        yield "model.language_model.b", torch.zeros(1 << 18)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path / "ckpt", {}, dies(), FIXTURE_DIR, 1 << 20, "float32")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(HarnessError, match="exists and is not empty"):
        write_checkpoint(tmp_path / "full", {}, iter(()), FIXTURE_DIR)
