"""The streaming load (harness/export/stream.py): a checkpoint read module by module and quantized as
it is read, so that E2B never exists in FP32. It must give exactly the model that loading it whole
and then quantizing gives, every tensor bit for bit, for every recipe, from both the flat and the
multimodal snapshot layout; and the per-layer table quantized in blocks of rows must equal it
quantized whole. Kept in the artifact cache (harness/export/quantized.py), it must come back the same
model, bit for bit, and one that reads back different is never kept."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.export.quantized import tensor_differences as differences
from harness.models.checkpoint import resave_multimodal
from harness.models.load import FIXTURE_DIR, load_fixture
from harness.recipes import RECIPES, get_recipe

pytestmark = pytest.mark.mac


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return resave_multimodal(FIXTURE_DIR, tmp_path_factory.mktemp("stream") / "snap", 1 << 20)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_streaming_gives_the_whole_load_then_quantize_bit_for_bit(recipe, snapshot):
    from harness.export.quantize import quantize
    from harness.export.stream import load_quantized

    want, summary = quantize(load_fixture().model, get_recipe(recipe))
    for where in (FIXTURE_DIR, snapshot):
        got, streamed = load_quantized(where, get_recipe(recipe), row_block=100)  # 1024 rows: 11 blocks
        assert differences(got, want) == [], f"{recipe} streamed from {where.name}"
        assert {k: v for k, v in streamed.items() if k not in ("streamed", "seconds")} == summary
        assert not any(p.requires_grad for p in got.parameters())


def test_the_check_fails_on_a_model_that_differs_by_one_weight():
    """The comparison above can fail: one INT4 code changed in one linear is found by name."""
    from harness.export.quantize import quantize

    a, _ = quantize(load_fixture().model, get_recipe("8da4w"))
    b, _ = quantize(load_fixture().model, get_recipe("8da4w"))
    w = b.model.layers[2].mlp.down_proj.weight
    w.qdata[0, 0] = (w.qdata[0, 0] + 1) % 7
    assert differences(a, b) == ["model.layers.2.mlp.down_proj.weight:qdata"]


def test_a_row_block_that_splits_unevenly_joins_to_the_whole_table():
    """Blocks of 1000 over 1024 rows (one block of 24): the regression is a last block lost or
    its scales misaligned."""
    import torch

    from harness.export.stream import Checkpoint, _quantize_rows
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    ckpt = Checkpoint(FIXTURE_DIR)
    name = "model.embed_tokens_per_layer.weight"
    got = _quantize_rows(ckpt, name, 1000)
    emb = torch.nn.Embedding(*ckpt.shape(name), _weight=ckpt.get(name))
    quantize_(torch.nn.Sequential(emb), IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
              filter_fn=lambda m, fqn: m is emb)
    for n in got.tensor_data_names:
        assert torch.equal(getattr(got, n), getattr(emb.weight, n)), n
    assert got.block_size == emb.weight.block_size and got.shape == emb.weight.shape


def test_a_checkpoint_missing_a_tensor_is_refused_in_one_line(tmp_path):
    from safetensors.torch import load_file, save_file

    from harness.export.stream import load_quantized

    out = tmp_path / "short"
    out.mkdir()
    tensors = load_file(str(FIXTURE_DIR / "model.safetensors"))
    del tensors["model.layers.3.mlp.up_proj.weight"]
    save_file(tensors, str(out / "model.safetensors"))
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (out / f).write_bytes((FIXTURE_DIR / f).read_bytes())
    with pytest.raises(HarnessError, match=r"lacks 1 text-decoder tensors \(e.g. model.layers.3.mlp.up_proj.weight\)"):
        load_quantized(out, get_recipe("8da4w"))


def test_a_big_checkpoint_streams_by_default_and_then_holds_no_fp32_model(monkeypatch):
    """The pipeline streams a quantizing recipe on a checkpoint directory past STREAM_ABOVE_BYTES
    (here lowered to 0), says the same tokens eagerly as the whole load, and refuses the FP32 stages
    in one line instead of running the quantized model under their name."""
    from harness.export import pipeline as build_pipeline
    from harness.pipeline import Pipeline

    whole = Pipeline("fixture", "8da4w")
    assert not whole.streamed
    monkeypatch.setattr(build_pipeline, "STREAM_ABOVE_BYTES", 0)
    streamed = Pipeline(str(FIXTURE_DIR), "8da4w")
    assert streamed.streamed and not Pipeline(str(FIXTURE_DIR), "fp32").streamed
    prompt = "The capital of France is"
    assert streamed.generate(prompt, "eager").ids == whole.generate(prompt, "eager").ids
    with pytest.raises(HarnessError, match="loaded quantized .* no FP32 model"):
        streamed.hf_generate(prompt)


def test_a_released_model_keeps_what_the_lowering_needs(tmp_path):
    """After the .pt2 is written the model's tensors may go (5 GB at E2B); its config and
    generation settings must stay, or the .pte's key and metadata would change."""
    from harness.cache import ArtifactCache
    from harness.pipeline import Pipeline
    from harness.program import runner_metadata

    pipe = Pipeline(str(FIXTURE_DIR), "8da4w", cache=ArtifactCache(tmp_path), stream=True)
    key, meta = pipe._key("pte"), runner_metadata(pipe.loaded, pipe.settings, pipe.recipe)
    pipe.release_model()
    assert all(p is None for m in pipe.quantized.modules() for p in m._parameters.values())
    assert pipe._key("pte") == key and runner_metadata(pipe.loaded, pipe.settings, pipe.recipe) == meta


@pytest.mark.parametrize("recipe", ["8da4w", "8da4w-fast"])
def test_eager_lookups_gather_rows_before_dequantizing_bit_for_bit(recipe):
    """The eager runtime's quantized lookups (harness/runtimes/pytorch.py) dequantize only the
    rows looked up, and must give torchao's whole-table floats exactly; and they must really take
    the gathering path (the regression: an API change sending them back to 9.4 GB per call)."""
    import torch

    from harness.export.quantize import quantize
    from harness.runtimes.pytorch import gathered_embeddings

    model, _ = quantize(load_fixture().model, get_recipe(recipe))
    ids = torch.tensor([[2, 7, 1023, 7, 0, 511]])
    tables = [model.model.embed_tokens_per_layer] + ([model.model.embed_tokens] if recipe.endswith("fast") else [])
    for emb in tables:
        want = emb(ids)
        with gathered_embeddings():
            got = emb(ids)
        assert got.dtype == want.dtype and torch.equal(got, want), emb
    calls = []
    dequantize = type(tables[0].weight).dequantize

    def counting(self):
        calls.append(self.qdata.shape[0])
        return dequantize(self)

    type(tables[0].weight).dequantize = counting
    try:
        with gathered_embeddings():
            tables[0](ids)
    finally:
        type(tables[0].weight).dequantize = dequantize
    assert calls == [ids.numel()], f"dequantized {calls} rows for {ids.numel()} looked up"


# ---- the streamed model in the artifact cache (harness/export/quantized.py) ---------------------
def test_the_streamed_model_comes_back_from_the_cache_bit_for_bit(snapshot, tmp_path):
    """Built once (streamed, written, read back, compared), then taken from the cache: the same
    tensors as the streamed load, the same logits, and the summary says which run built it."""
    import torch

    from harness.cache import ArtifactCache
    from harness.export.quantized import load_quantized_cached
    from harness.export.stream import load_quantized

    recipe = get_recipe("8da4w-fast")
    cache = ArtifactCache(tmp_path / "cache")
    want, _ = load_quantized(snapshot, recipe)
    first, s1 = load_quantized_cached(snapshot, recipe, cache)
    second, s2 = load_quantized_cached(snapshot, recipe, cache)
    assert [e[2] for e in cache.events] == ["build", "hit"]
    assert (s1["cached"], s2["cached"]) == (False, True) and s2["group_size"] == s1["group_size"]
    assert differences(first, want) == [] and differences(second, want) == []
    tied = [m.lm_head.weight is m.model.embed_tokens.weight for m in (want, first, second)]
    assert tied[1:] == tied[:1] * 2, "the cache tied or untied lm_head and the token table"
    ids = torch.tensor([[2, 17, 300, 511, 1000 % want.config.vocab_size]])
    with torch.no_grad():
        assert torch.equal(second(input_ids=ids).logits, want(input_ids=ids).logits)


def test_the_key_moves_with_the_recipe_and_the_checkpoint(snapshot, tmp_path):
    import shutil

    from harness.export.quantized import quantized_key

    assert quantized_key(snapshot, get_recipe("8da4w")) != quantized_key(snapshot, get_recipe("8da4w-fast"))
    other = tmp_path / "other"
    shutil.copytree(snapshot, other)
    shard = sorted(other.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    shard.write_bytes(bytes(data))
    assert quantized_key(other, get_recipe("8da4w")) != quantized_key(snapshot, get_recipe("8da4w"))


def test_a_model_that_reads_back_different_is_not_kept(snapshot, tmp_path, monkeypatch):
    """The verification after writing can fail: here the read-back has one INT4 code changed (as a
    serializer that lost a tensor's contents would), and the entry is refused, nothing cached."""
    from harness.cache import ArtifactCache
    from harness.export import quantized

    read_back = quantized.read_back

    def tampered(path, directory):
        model = read_back(path, directory)
        w = model.model.layers[1].self_attn.o_proj.weight
        w.qdata[0, 0] = (w.qdata[0, 0] + 1) % 7
        return model

    monkeypatch.setattr(quantized, "read_back", tampered)
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(HarnessError, match=r"reads back different \(1 tensors, e.g. model.layers.1.self_attn.o_proj.weight:qdata\)"):
        quantized.load_quantized_cached(snapshot, get_recipe("8da4w"), cache)
    assert not list((tmp_path / "cache").glob("quantized-*")), "a model that read back different was cached"


def test_a_streamed_pipeline_takes_its_model_from_the_cache_the_second_time(tmp_path):
    from harness.cache import ArtifactCache
    from harness.pipeline import Pipeline

    cache = ArtifactCache(tmp_path / "cache")
    prompt = "The capital of France is"
    first = Pipeline(str(FIXTURE_DIR), "8da4w", cache=cache, stream=True)
    second = Pipeline(str(FIXTURE_DIR), "8da4w", cache=cache, stream=True)
    import torch

    a, b = first.generate(prompt, "eager"), second.generate(prompt, "eager")
    assert a.ids == b.ids and all(torch.equal(x, y) for x, y in zip(a.step_logits, b.step_logits, strict=True))
    assert (first.records["load+quantize"].cached, second.records["load+quantize"].cached) == (False, True)


def test_the_activation_capture_gathers_rows_before_dequantizing():
    """The activation goldens' teacher-forced forward (harness/goldens/activations.py) looks up the
    quantized per-layer table row first, as the eager runtime does: the regression is torchao's
    whole-table lookup, 9.4 GB of FP32 per forward at E2B size (an eager stage at 23 GiB)."""
    from harness.export.quantize import quantize
    from harness.goldens.activations import capture

    model, _ = quantize(load_fixture().model, get_recipe("8da4w-fast"))
    table = model.model.embed_tokens_per_layer.weight
    ids = [2, 17, 300, 511, 12, 12]
    calls = []
    dequantize = type(table).dequantize

    def counting(self):
        if self.qdata.shape[1] == table.qdata.shape[1]:  # the per-layer table, or rows of it
            calls.append(self.qdata.shape[0])
        return dequantize(self)

    type(table).dequantize = counting
    try:
        capture(model, ids)
    finally:
        type(table).dequantize = dequantize
    assert calls and max(calls) == len(ids), f"dequantized {calls} rows of the per-layer table for {len(ids)} ids"
