"""Name the component: each class of upstream change, injected into the eager model, makes the
localization line name that very component (and not a later one), against the committed activation
goldens; the benign moves of tests/test_tolerance_calibration.py make it name none.

The line reads: "first component to move in fp32:eager: layer 3 attention (full attention, its KV
shared onward) moves 0.41 (relative L2) at position 17 (...); everything before it (...) within 0.0008".
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from support import FIXTURE_PROMPTS
from harness.goldens.activations import activation_tolerance, first_beyond, localize, moves
from harness.goldens.store import activation_golden_path, read_json_golden

pytestmark = pytest.mark.mac

PROMPT = FIXTURE_PROMPTS[0]


def golden(recipe: str, prompt: str = PROMPT) -> dict:
    return read_json_golden(activation_golden_path(recipe, prompt))


def first_moved(model, recipe: str, prompt: str = PROMPT):
    tol = activation_tolerance(recipe)[1]
    found = moves(model, golden(recipe, prompt))
    return first_beyond(found, tol), localize(found, tol, f"{recipe}:eager", golden(recipe, prompt)["prompt_length"])


# ---- the injections: each as an upstream release could bring it ------------------------------
def embedding_scale(m):
    m.model.embed_tokens.embed_scale.mul_(1.01)


def per_layer_input_scale(m):  # the per-layer token embedding's own sqrt(d) scale, not the benign overall one
    m.model.embed_tokens_per_layer.embed_scale.mul_(1.5)


def per_layer_inputs_shifted(m):
    project = m.model.project_per_layer_inputs
    m.model.project_per_layer_inputs = lambda *a, **k: project(*a, **k).roll(1, dims=2)


def rope(kind):
    def inject(m):
        freq = getattr(m.model.rotary_emb, f"{kind}_inv_freq")
        freq.mul_(1.1)
    return inject


def sliding_window_edge(m):
    m.config.sliding_window -= 1
    for layer in m.model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window -= 1


def kv_sharing_wiring(m):
    """The sliding layers' shared KV taken from layer 1 instead of layer 2 (the last sliding layer
    before the shared ones)."""
    layers = m.model.layers
    layers[2].self_attn.store_full_length_kv, layers[1].self_attn.store_full_length_kv = False, True


def mlp_activation(m):
    """``hidden_activation`` read as the default SiLU (a config key renamed upstream). Exact GELU in
    place of the tanh approximation moves the MLPs by 1.9e-4, under the float16 floor of the fp32
    goldens."""
    for layer in m.model.layers:
        layer.mlp.act_fn = torch.nn.SiLU()


def final_softcap(m):
    m.config.final_logit_softcapping = m.config.final_logit_softcapping * 0.8


def quantization_scales(layer: int):
    """torchao rounding one weight's scales differently (every group of layer 2's MLP down projection)."""
    def inject(m):
        m.model.layers[layer].mlp.down_proj.weight.scale.mul_(1.5)
    return inject


# injected change -> (recipe, the component the line must name)
TEETH = {
    "embedding scale x1.01": (embedding_scale, "fp32", "embedding"),
    "per-layer embedding scale x1.5": (per_layer_input_scale, "fp32", "per-layer input 0"),
    "per-layer inputs shifted by one layer": (per_layer_inputs_shifted, "fp32", "per-layer input 0"),
    "RoPE of full attention x1.1": (rope("full_attention"), "fp32", "layer 3 attention"),
    "RoPE of sliding attention x1.1": (rope("sliding_attention"), "fp32", "layer 0 attention"),
    "sliding window one shorter": (sliding_window_edge, "fp32", "layer 0 attention"),
    "KV sharing from another layer": (kv_sharing_wiring, "fp32", "layer 4 attention"),
    "MLP activation read as SiLU": (mlp_activation, "fp32", "layer 0 MLP"),
    "final softcap x0.8": (final_softcap, "fp32", "logits (softcapped)"),
    "layer 2 down_proj scales x1.5": (quantization_scales(2), "8da4w", "layer 2 MLP"),
}


@pytest.mark.parametrize("change", list(TEETH))
def test_the_line_names_the_component_that_moved(pipeline, change):
    inject, recipe, want = TEETH[change]
    model = copy.deepcopy(pipeline(recipe).quantized)
    with torch.no_grad():
        inject(model)
    first, line = first_moved(model, recipe)
    assert first is not None, f"{change}: nothing moved beyond tolerance: {line}"
    assert first.component.name == want, f"{change}: named {first.component.name}, not {want}: {line}"
    assert line.startswith(f"first component to move in {recipe}:eager: {want}")


def test_the_sliding_window_edge_moves_only_past_the_window(pipeline):
    model = copy.deepcopy(pipeline("fp32").quantized)
    sliding_window_edge(model)
    first, _ = first_moved(model, "fp32")
    assert first.position >= model.config.sliding_window, "a shorter window moved a position inside it"


def test_the_untouched_model_names_nothing(pipeline):
    for recipe in ("fp32", "8da4w"):
        for prompt in FIXTURE_PROMPTS:
            first, line = first_moved(pipeline(recipe).quantized, recipe, prompt)
            assert first is None, line
            assert "every component within" in line


def _nudged(pipeline, recipe):
    from harness.pipeline import Pipeline

    base = pipeline("fp32").loaded
    model = copy.deepcopy(base.model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 1e-6)
    return Pipeline(dataclasses.replace(base, model=model), recipe).quantized


def _rescaled(pipeline, recipe):
    from harness.pipeline import Pipeline

    base = pipeline("fp32").loaded
    model = copy.deepcopy(base.model)
    model.model.per_layer_input_scale = model.model.per_layer_input_scale * 0.6
    return Pipeline(dataclasses.replace(base, model=model), recipe).quantized


@pytest.mark.parametrize("move", [_nudged, _rescaled], ids=["weights x(1+1e-6)", "per_layer_input_scale x0.6"])
@pytest.mark.parametrize("recipe", ["fp32", "8da4w"])
def test_a_benign_move_names_nothing(pipeline, move, recipe):
    model = move(pipeline, recipe)
    for prompt in FIXTURE_PROMPTS:
        first, line = first_moved(model, recipe, prompt)
        assert first is None, f"false alarm: {line}"


def test_the_diff_prints_the_line_before_the_token_lines(computed_goldens, pipeline):
    """``goldens diff`` on an injected embedding scale: the localization line right after the stack's
    differences, before any change line."""
    from harness.goldens.activations import activation_goldens
    from harness.goldens.refresh import _diff, diff_summary

    model = copy.deepcopy(pipeline("fp32").quantized)
    with torch.no_grad():
        embedding_scale(model)
    c = computed_goldens
    prompts = {p: c.prompts[p]["ids"] for p in FIXTURE_PROMPTS}
    answers = {("fp32", p): c.runs[("fp32", "eager", p)].ids for p in FIXTURE_PROMPTS}
    acts, localized = activation_goldens(lambda r: model, prompts, answers, recipes=("fp32",))
    moved = dataclasses.replace(c, activations={**c.activations, **acts}, localized={**c.localized, **localized})
    lines: list[str] = []
    c2, a, rc = _diff(moved, lines.append, lambda m: None, None, None)
    assert rc == 1 and diff_summary(c2, a, rc)["localized"][0].startswith("first component to move in fp32:eager: embedding")
    first_change = next(i for i, l in enumerate(lines) if l.startswith("- ["))
    at = next(i for i, l in enumerate(lines) if l.startswith("localized: first component to move in fp32:eager: embedding"))
    assert at < first_change
    assert any("[activations]" in l for l in lines)


def test_a_sketched_component_keeps_the_size_of_a_move():
    """At E2B size a component wider than FULL_UP_TO is stored as a +-1 projection: a move's relative
    size read through it stays within the 25% the docstring promises, for moves of every shape."""
    from harness.goldens.activations import FULL_UP_TO, SKETCH_BOUND, SKETCH_DIM, reduce

    g = torch.Generator().manual_seed(0)
    golden_vectors = torch.randn(40, 4 * FULL_UP_TO, generator=g)
    assert reduce(golden_vectors, False).shape == (40, SKETCH_DIM)
    assert reduce(golden_vectors[:, :FULL_UP_TO], False).shape == (40, FULL_UP_TO)
    for move in (torch.randn(40, 4 * FULL_UP_TO, generator=g) * 0.1,  # everywhere
                 torch.zeros(40, 4 * FULL_UP_TO).index_fill_(1, torch.tensor([7]), 3.0),  # one channel
                 golden_vectors * 0.2):  # a scale
        exact = move.norm(dim=-1).pow(2).mean().sqrt() / golden_vectors.norm(dim=-1).pow(2).mean().sqrt()
        a, b = reduce(golden_vectors + move, False).float(), reduce(golden_vectors, False).float()
        seen = (a - b).norm(dim=-1).pow(2).mean().sqrt() / b.norm(dim=-1).pow(2).mean().sqrt()
        assert abs(float(seen / exact) - 1) < SKETCH_BOUND, (float(seen), float(exact))
