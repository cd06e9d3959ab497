"""The streaming load (harness/export/stream.py): a checkpoint read module by module and quantized as
it is read, so that E2B never exists in FP32. It must give exactly the model that loading it whole
and then quantizing gives, every tensor bit for bit, for every recipe, from both the flat and the
multimodal snapshot layout; and the per-layer table quantized in blocks of rows must equal it
quantized whole."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.models.checkpoint import resave_multimodal
from harness.models.load import FIXTURE_DIR, load_fixture
from harness.recipes import RECIPES, get_recipe

pytestmark = pytest.mark.mac


def flat_tensors(model) -> dict:
    """Every tensor of the model by name, a torchao tensor as its inner tensors (codes, scales,
    zero points) plus its attributes; tied weights under each name."""
    out = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        inner = getattr(t, "tensor_data_names", None)
        if inner:
            for n in inner:
                out[f"{name}:{n}"] = getattr(t, n)
            out[f"{name}:attrs"] = tuple(str(getattr(t, a)) for a in t.tensor_attribute_names) + (type(t).__name__,)
        else:
            out[name] = t
    return out


def differences(a, b) -> list[str]:
    import torch

    fa, fb = flat_tensors(a), flat_tensors(b)
    diff = sorted(set(fa) ^ set(fb))
    for k in sorted(set(fa) & set(fb)):
        x, y = fa[k], fb[k]
        if isinstance(x, tuple):
            same = x == y
        else:
            same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        if not same:
            diff.append(k)
    return diff


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
