"""The E2B-shaped checkpoint writer (``harness make-checkpoint``), on its small shape: the real
snapshot's layout, every value of E2B's text configuration pinned, seeded and reproducible weights,
a tokenizer whose vocabulary matches with Gemma's special ids, a model the harness loads and whose
activations stay finite and bounded through every layer, and nothing left behind by a failed write.
The full E2B shape (9.3 GB) is written only by the ``scale`` work, never in this tier."""

from __future__ import annotations

import hashlib
import json

import pytest

from harness.errors import HarnessError
from support import run_cli

pytestmark = pytest.mark.mac


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic") / "gemma-4-small"
    rc, stdout, stderr = run_cli(["make-checkpoint", "--shape", "small", str(out), "--shard-gb", "0.0005"])
    assert rc == 0, stderr
    return out


def test_e2b_text_configuration_is_the_released_one():
    """The values the issue and the public E2B release state, and what transformers builds from
    them: 4,628,569,344 text parameters (2.35B of them the per-layer table), KV shared from layer
    15 on, double-wide MLPs there, 512-wide full-attention heads."""
    from transformers import Gemma4TextConfig

    from harness.training.synthetic import E2B_TEXT_PARAMETERS, parameter_count, tensor_shapes, text_config

    c = text_config("e2b")
    expected = {"hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35, "num_attention_heads": 8,
                "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512, "sliding_window": 512,
                "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144, "vocab_size": 262144,
                "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "num_kv_shared_layers": 20,
                "use_double_wide_mlp": True, "attention_k_eq_v": False}
    assert {k: c[k] for k in expected} == expected
    assert [i for i, t in enumerate(c["layer_types"]) if t == "full_attention"] == [4, 9, 14, 19, 24, 29, 34]
    assert c["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0
    assert c["rope_parameters"]["full_attention"] == {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                      "rope_theta": 1000000.0}
    cfg = Gemma4TextConfig(**{k: v for k, v in c.items() if k != "model_type"})
    assert cfg.per_layer_config[4].head_dim == 512 and cfg.per_layer_config[0].head_dim == 256
    assert parameter_count(c) == E2B_TEXT_PARAMETERS
    shapes = {name.split("language_model.", 1)[1]: dims for name, dims, _ in tensor_shapes(c)}
    assert shapes["embed_tokens_per_layer.weight"] == (262144, 35 * 256)
    assert shapes["layers.15.mlp.gate_proj.weight"] == (12288, 1536)  # KV-shared: double-wide
    assert shapes["layers.14.mlp.gate_proj.weight"] == (6144, 1536)
    assert "layers.15.self_attn.k_proj.weight" not in shapes and "layers.14.self_attn.k_proj.weight" in shapes


def test_the_small_checkpoint_has_the_real_layout(small):
    from harness.models.checkpoint import INDEX, TEXT_PREFIX
    from harness.training.synthetic import is_synthetic, tensor_shapes, text_config

    config = json.loads((small / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"] and config["model_type"] == "gemma4"
    assert config["text_config"]["model_type"] == "gemma4_text" and config["dtype"] == "bfloat16"
    index = json.loads((small / INDEX).read_text())
    shards = sorted(p.name for p in small.glob("model-*.safetensors"))
    assert len(shards) >= 3 and set(index["weight_map"].values()) == set(shards)
    expected = {name for name, _, _ in tensor_shapes(text_config("small"))}
    assert set(index["weight_map"]) == expected and all(k.startswith(TEXT_PREFIX) for k in expected)
    assert is_synthetic(small) and not list(small.parent.glob(".*making*"))


def test_the_tokenizer_matches_the_vocabulary_with_gemmas_special_ids(small):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(small / "tokenizer.json"))
    config = json.loads((small / "config.json").read_text())["text_config"]
    assert tok.get_vocab_size() == config["vocab_size"] == 2048
    assert [tok.token_to_id(t) for t in ("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>")] == [0, 1, 2, 105, 106]
    assert config["eos_token_id"] == [1, 106]
    ids = tok.encode("What is the capital of France?").ids
    assert ids and max(ids) < 2048 and tok.decode(ids).strip() == "What is the capital of France?"


def test_the_weights_are_seeded_and_reproducible(small, tmp_path):
    def digest(d):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("model-*.safetensors"))}

    again = tmp_path / "again"
    other = tmp_path / "other"
    assert run_cli(["make-checkpoint", "--shape", "small", str(again), "--shard-gb", "0.0005"])[0] == 0
    assert run_cli(["make-checkpoint", "--shape", "small", str(other), "--shard-gb", "0.0005", "--seed", "1"])[0] == 0
    assert digest(again) == digest(small)
    assert digest(other) != digest(small)


def activation_problem(directory) -> str | None:
    """Through transformers' multimodal loader, a 31-token prompt (longer than the window): None
    when the logits are finite under the softcap, greedy choices are not all one token, and the
    residual stream grows no faster than its layers' updates add up. Each layer adds its attention,
    MLP and per-layer-input outputs, each through a post-norm with unit weights (RMS 1), so growth
    past 3 per layer is the weights, not the architecture."""
    import torch

    from harness.models.spec import load_model

    model = load_model(str(directory)).model
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[2] + list(range(200, 230))]), output_hidden_states=True)
    rms = [float(h.pow(2).mean().sqrt()) for h in out.hidden_states]
    logits = out.logits[0]
    if not torch.isfinite(logits).all() or float(logits.abs().max()) > 30.0:
        return f"logits not finite or past the softcap (max |logit| {float(logits.abs().max())})"
    if len(set(logits.argmax(-1).tolist())) <= 3:
        return f"greedy picks only {set(logits.argmax(-1).tolist())}"
    if not all(r == r and r > 0 for r in rms) or max(rms[1:-1]) >= rms[0] + 3 * model.config.num_hidden_layers:
        return f"the residual stream grows past its layers' updates: RMS per layer {[round(r, 3) for r in rms]}"
    return None


def test_it_loads_and_its_activations_stay_bounded_through_every_layer(small):
    """Random weights must not break what real ones would not. Measured on the small shape:
    residual RMS 0.16 after the embedding, 1.7 after layer 1, 4.9 after layer 10, a random walk of
    unit updates, not an overflow (2026-12-03, with q/k norms of ones; the post-norms that set
    these RMS do not depend on them)."""
    problem = activation_problem(small)
    assert problem is None, problem


def test_norms_that_grow_the_stream_fail_the_activation_check(tmp_path, monkeypatch):
    """The regression it names (the issue's example): norm weights a trained model would not have,
    here 10 instead of 1, overflow the stream's growth bound, and the check says so."""
    from harness.training import synthetic

    real = synthetic.random_tensor

    def loud_norms(name, shape, kind, std, seed):
        t = real(name, shape, kind, std, seed)
        return t * 10 if kind == "norm" and "post_" in name else t

    monkeypatch.setattr(synthetic, "random_tensor", loud_norms)
    out = synthetic.make_checkpoint(tmp_path / "loud", shape="small", shard_bytes=1 << 20, progress=lambda m: None)
    problem = activation_problem(out)
    assert problem is not None and "grows past" in problem, problem


def nudge_gain(config: dict) -> float:
    """How many times a 1e-6 relative nudge of the token embeddings grows by the last position's
    logits (max |difference| over the nudge times max |logit|), in FP32 on a model holding the
    writer's own weights (``random_weights``) for ``config``: about 1 for a network that carries
    rounding as rounding, thousands for a chaotic one."""
    import torch
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

    from harness.models.checkpoint import TEXT_PREFIX
    from harness.training.synthetic import random_weights

    model = Gemma4ForCausalLM(Gemma4TextConfig(**{k: v for k, v in config.items() if k != "model_type"})).eval()
    weights = {"model." + name[len(TEXT_PREFIX):]: t.float() for name, t in random_weights(config, seed=0)}
    missing, unexpected = model.load_state_dict(weights, strict=False)  # lm_head is tied to embed_tokens
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    ids = torch.arange(4, 4 + 40).unsqueeze(0) * 7 % int(config["vocab_size"])

    def last_logits(nudge: float):
        hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: o * nudge)
        try:
            with torch.no_grad():
                return model(ids, use_cache=False).logits[0, -1].double()
        finally:
            hook.remove()

    a, b = last_logits(1.0), last_logits(1 + 1e-6)
    return float((b - a).abs().max() / (1e-6 * a.abs().max()))


def deep_narrow() -> dict:
    """E2B's depth, layer pattern, KV sharing and head dims (256 / 512, what makes attention sharp)
    at hidden 128 and a 512-token vocabulary: seconds on a CPU."""
    from harness.training.synthetic import text_config

    config = text_config("e2b")
    config.update(hidden_size=128, intermediate_size=256, vocab_size=512, vocab_size_per_layer_input=512,
                  hidden_size_per_layer_input=16)
    return config


def chaos_problem(record: bool = True) -> str | None:
    """None when the writer's weights at E2B's depth and head dims carry a nudge as rounding
    (``synthetic/nudge_gain``), else what they do to it; ``record``: report the gain to the
    tolerance re-measurement (not for a deliberately broken scheme)."""
    from harness.tolerances import observe, tolerance

    gain = nudge_gain(deep_narrow())
    if record:
        observe("synthetic/nudge_gain", gain)
    if gain <= tolerance("synthetic/nudge_gain").atol:
        return None
    return (f"a 1e-6 nudge of the embeddings grows {gain:.0f}x by the logits: the generated weights are chaotic, "
            f"so no agreement at size can be told from noise")


def test_generated_weights_are_not_chaotic_at_e2bs_depth_and_head_dims():
    """Gemma 4 attends with scaling 1.0 (the trained q/k norms carry 1/sqrt(head_dim)); with ones
    there, a random E2B's softmaxes are one-hot and rounding flips them. With the writer's
    ``head_dim ** -1/4`` norms the gain was 1.6 (2026-12-05)."""
    problem = chaos_problem()
    assert problem is None, problem


def test_q_and_k_norms_of_ones_make_the_generated_model_chaotic(monkeypatch):
    """The regression the scheme names: transformers' init (ones) for q_norm and k_norm makes the
    same model amplify the nudge past the bound (3,792x, 2026-12-05)."""
    from harness.training import synthetic

    monkeypatch.setattr(synthetic, "QK_NORM", 0.0)
    problem = chaos_problem(record=False)
    assert problem is not None and "chaotic" in problem


def test_a_checkpoint_from_the_chaotic_scheme_is_told_apart(small, tmp_path):
    """The scale tier's agreement check needs the current weights: a checkpoint written before the
    q/k norms were scaled (its marker says so) is named, with the command that replaces it."""
    from harness.training.synthetic import MARKER, stale_weights

    assert stale_weights(small) is None
    (tmp_path / MARKER).write_text(json.dumps(
        {"weights": "seeded random: N(0, initializer_range) matrices, ones for norms and layer scalars"}))
    why = stale_weights(tmp_path)
    assert why is not None and "make-checkpoint" in why and "\n" not in why


def test_a_full_disk_is_refused_before_writing(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 10**6, 10**6))
    rc, _, err = run_cli(["make-checkpoint", "--shape", "e2b", str(tmp_path / "e2b")])
    assert rc != 0 and "needs 9.3 GB" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "e2b").exists()


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    from harness.training import synthetic

    def dies(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "random_tensor", dies)
    with pytest.raises(KeyboardInterrupt):
        synthetic.make_checkpoint(tmp_path / "small", shape="small", progress=lambda m: None)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_shape_is_refused():
    from harness.training.synthetic import text_config

    with pytest.raises(HarnessError, match="e2b, small"):
        text_config("e4b")


def test_the_preflight_refuses_fp32_at_e2b_size_in_one_line(tmp_path):
    """fp32 at E2B's size needs about 18.5 GB of weights before any stage copies them: on a 16 GB
    laptop (and on this 24 GB host) the pre-flight refuses before loading, in one line, from the
    shape alone (config only: nothing is allocated)."""
    from harness.export.preflight import check, model_size
    from harness.training.synthetic import E2B_TEXT_PARAMETERS, text_config

    spec = tmp_path / "e2b-text.json"
    spec.write_text(json.dumps(text_config("e2b")))
    size = model_size(str(spec))
    assert abs(size.params - E2B_TEXT_PARAMETERS) <= 64, size.params  # the 35 layer scalars
    with pytest.raises(HarnessError, match="not enough memory") as e:
        check(size, "fp32", "load", available=16 << 30, rss=0)
    assert "\n" not in str(e.value) and "4,628.6M parameters" in str(e.value)
    check(size, "fp32", "load", available=64 << 30, rss=0)  # where it fits, it passes
