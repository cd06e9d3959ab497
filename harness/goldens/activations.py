"""Activation goldens: each component's output at every position, so that a moved golden names the
part of the model that moved first (issue "Name the component").

Recorded at the ``fp32`` and ``8da4w`` eager stages, per prompt, by one teacher-forced forward of
the transformers model over the prompt and that stage's golden answer, with forward hooks on:
the token embedding; the per-layer input each decoder layer receives; in each layer its attention
output, its MLP output and its residual stream (the layer's output); the final norm; the logits
before the final softcap and after it. Compared in that order (forward order): the move of a
component is the RMS over positions of ``||now - golden||`` over the RMS over positions of
``||golden||`` (its typical size, so a position where it happens to be tiny does not turn one INT8
code flip into a 100% move), and the line names the position where it is largest. A per-layer input
is compared up to its scale: its layer multiplies it into a gated projection that an RMSNorm normalizes, so a uniform
scale cancels there (the benign ``per_layer_input_scale`` move, tests/test_tolerance_calibration.py)
while a shifted layer, or a new mix of its two parts, does not.

Stored as float16 vectors where the model is small (the fixture: hidden 128, vocabulary 1024); the
rounding is a relative 2^-11 per element, far below any move worth naming. At E2B size a float16
vector of every component at every position is ~190 MB a prompt (35 layers x 3 x 1536 plus a
262,144-token vocabulary): each vector is stored instead as a fixed {+1,-1} projection to
``SKETCH_DIM`` numbers (an integer hash, not a random generator, so no library upgrade changes it).
For any fixed move, the projection keeps its relative L2 size within about +-25% (Johnson-
Lindenstrauss at 64 dimensions), which is what localization needs: which component moved first,
and by roughly how much.

The diff compares on the golden's own input ids (teacher forcing), so a changed answer does not
move the inputs under the comparison.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

FULL_UP_TO = 1024  # a component this wide or narrower (the fixture: all of them) is stored whole (float16); wider ones sketched
SKETCH_DIM = 64
SKETCH_BOUND = 0.25  # a move read through the projection keeps its relative size within this fraction (tests/test_localization.py)
ACTIVATION_RECIPES = ("fp32", "8da4w")


@dataclass(frozen=True)
class Component:
    name: str  # "embedding", "per-layer input 2", "layer 3 attention", ...
    part: str  # embedding | per_layer_input | attention | mlp | residual | final_norm | logits | softcapped
    layer: int | None = None
    kind: str = ""  # for a layer: "sliding attention, KV-shared" and so on

    @property
    def scale_free(self) -> bool:
        return self.part == "per_layer_input"


def components(model) -> list[Component]:
    """The model's components in forward order."""
    cfg = model.config
    layers = model.model.layers
    out = [Component("embedding", "embedding")]
    if getattr(cfg, "hidden_size_per_layer_input", 0):
        out += [Component(f"per-layer input {i}", "per_layer_input", i, layer_kind(model, i)) for i in range(len(layers))]
    for i in range(len(layers)):
        kind = layer_kind(model, i)
        out += [Component(f"layer {i} attention", "attention", i, kind), Component(f"layer {i} MLP", "mlp", i, kind),
                Component(f"layer {i} output", "residual", i, kind)]
    return out + [Component("final norm", "final_norm"), Component("logits before softcap", "logits"),
                  Component("logits (softcapped)", "softcapped")]


def layer_kind(model, i: int) -> str:
    attn = model.model.layers[i].self_attn
    kind = model.config.layer_types[i].replace("_", " ")
    if getattr(attn, "is_kv_shared_layer", False):
        kind += ", KV-shared"
    elif getattr(attn, "store_full_length_kv", False):
        kind += ", its KV shared onward"
    return kind


def capture(model, ids: list[int], keep=None) -> dict[str, "torch.Tensor"]:
    """Component name -> [positions, width], from one teacher-forced forward; ``keep(component,
    vectors)`` (default: ``reduce``) is applied inside each hook, so at E2B size no full-width copy
    of a component outlives its layer."""
    import torch

    comps = {c.name: c for c in components(model)}
    keep = keep or (lambda c, t: reduce(t, c.scale_free))
    got: dict[str, torch.Tensor] = {}
    handles = []

    def store(name, vectors):
        got[name] = keep(comps[name], vectors.detach()[0].float())

    def hook(name, pick=lambda out: out):
        return lambda _module, _inputs, output: store(name, pick(output))

    m = model.model
    handles.append(m.embed_tokens.register_forward_hook(hook("embedding")))
    for i, layer in enumerate(m.layers):
        def pre(_module, args, kwargs, i=i):
            pli = args[1] if len(args) > 1 else kwargs.get("per_layer_input")
            if pli is not None:
                store(f"per-layer input {i}", pli)
        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(hook(f"layer {i} attention", lambda o: o[0])))
        handles.append(layer.mlp.register_forward_hook(hook(f"layer {i} MLP")))
        handles.append(layer.register_forward_hook(hook(f"layer {i} output")))
    handles.append(m.norm.register_forward_hook(hook("final norm")))
    handles.append(model.lm_head.register_forward_hook(hook("logits before softcap")))
    from harness.runtimes.pytorch import gathered_embeddings

    try:
        # quantized lookups gather their rows first, bit for bit: torchao's own dequantizes the whole
        # table, E2B's per-layer one 9.4 GB of FP32, on every forward (a 23 GiB eager stage)
        with torch.no_grad(), gathered_embeddings():
            out = model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    store("logits (softcapped)", out.logits)
    return got


# ---- storing ----------------------------------------------------------------------------------
def _signs(width: int):
    """A fixed [width, SKETCH_DIM] matrix of +-1/sqrt(SKETCH_DIM) from an integer hash of (i, j)."""
    import torch

    i = torch.arange(width, dtype=torch.int64)[:, None]
    j = torch.arange(SKETCH_DIM, dtype=torch.int64)[None, :]
    h = (i * 2654435761 + j * 40503 + 12345) % (1 << 32)
    h = (h ^ (h >> 15)) * 2246822519 % (1 << 32)
    bit = (h >> 13) & 1
    return (bit.float() * 2 - 1) / SKETCH_DIM ** 0.5


def reduce(vectors, scale_free: bool):
    """What is stored of [positions, width]: the vectors (scale-free ones at unit RMS), sketched
    when wider than FULL_UP_TO."""
    import torch

    v = vectors.float()
    if scale_free:
        v = v / v.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
    if v.shape[-1] > FULL_UP_TO:
        v = v @ _signs(v.shape[-1])
    return v.to(torch.float16)


def _pack(t) -> str:
    import numpy as np

    return base64.b64encode(t.numpy().astype("<f2").tobytes()).decode()


def _unpack(text: str, shape):
    import numpy as np
    import torch

    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype="<f2").astype("float32").reshape(shape))


def record(model, ids: list[int], prompt_length: int, got: dict | None = None) -> dict:
    """The activation golden of one prompt: its input ids and each component, reduced (``got``: the
    capture of ``ids``, where the caller has it)."""
    got = capture(model, ids) if got is None else got
    comps = {}
    for c in components(model):
        if c.name in got:
            r = got[c.name]
            comps[c.name] = {"shape": list(r.shape), "sketched": _width(model, c) > FULL_UP_TO, "data": _pack(r)}
    return {"ids": [int(i) for i in ids], "prompt_length": int(prompt_length), "format": "float16",
            "sketch_dim": SKETCH_DIM, "components": comps}


def _width(model, c: Component) -> int:
    cfg = model.config
    if c.part in ("logits", "softcapped"):
        return cfg.vocab_size
    return cfg.hidden_size_per_layer_input if c.part == "per_layer_input" else cfg.hidden_size


# ---- comparing --------------------------------------------------------------------------------
@dataclass
class Move:
    component: Component
    size: float  # the move over all positions: RMS of ||now - golden|| over the golden's RMS norm
    position: int  # where it is largest (an index into the golden's ids)
    peak: float = 0.0  # the move there, relative to the same typical size


def moves(model, golden: dict, got: dict | None = None) -> list[Move]:
    """Every component's move against ``golden`` (forward order), on the golden's ids (``got``: their
    capture, where the caller has it)."""
    got = capture(model, golden["ids"]) if got is None else got
    out = []
    for c in components(model):
        rec = golden["components"].get(c.name)
        if rec is None or c.name not in got:
            continue
        want = _unpack(rec["data"], rec["shape"])
        now = got[c.name].float()
        if now.shape != want.shape:
            out.append(Move(c, float("inf"), 0))
            continue
        # against the component's typical size (its RMS norm over positions): a position where the
        # golden happens to be tiny does not turn a rounding flip into a 100% move
        err = (now - want).norm(dim=-1)
        typical = want.norm(dim=-1).pow(2).mean().sqrt().clamp_min(1e-6)
        pos = int(err.argmax())
        out.append(Move(c, float(err.pow(2).mean().sqrt() / typical), pos, float(err[pos] / typical)))
    return out


def localize(found: list[Move], tol: float, label: str, prompt_length: int = 0) -> str:
    """One line: the first component beyond ``tol``, its layer and kind, the position and the move,
    and that everything before it is within bounds."""
    if not found:
        return f"activations of {label}: no activation golden to compare with"
    for k, m in enumerate(found):
        if m.size > tol:
            c = m.component
            what = c.name + (f" ({c.kind})" if c.kind else "")
            where = (f"position {m.position}" + (f" (prompt token {m.position})" if m.position < prompt_length
                     else f" (answer token {m.position - prompt_length})"))
            before = (f"everything before it ({_span(found[:k])}) within {tol:g}" if k else "it is the first component")
            return f"first component to move in {label}: {what} moves {m.size:.3g} (relative L2) at {where}; {before}"
    worst = max(found, key=lambda m: m.size)
    return (f"activations of {label}: every component within {tol:g} (largest: {worst.component.name} "
            f"{worst.size:.2g}); a golden that fails moved past this stage's model")


def _span(found: list[Move]) -> str:
    names = [m.component.name for m in found]
    return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}, {len(names)} components"


def first_beyond(found: list[Move], tol: float) -> Move | None:
    return next((m for m in found if m.size > tol), None)


def activation_tolerance(recipe: str) -> tuple[str, float]:
    """The tolerance's name and value for a recipe's activation goldens (a checkpoint's quantized
    recipes: 8da4w's, calibrated on the same benign moves)."""
    from harness.tolerances import tolerance

    name = f"activation_golden/{recipe if recipe in ACTIVATION_RECIPES else '8da4w'}"
    return name, tolerance(name).atol


# ---- the goldens' side ------------------------------------------------------------------------
def activation_goldens(model_for, prompt_ids: dict, answers: dict, key: str = "fixture",
                       recipes=ACTIVATION_RECIPES) -> tuple[dict, dict]:
    """``(records, localized)``: the new activation golden of each (recipe, prompt), recorded on the
    prompt and this stack's eager answer; and, where a golden is recorded, the localization line
    against it (computed on the golden's own ids), whether a component moved beyond its tolerance and
    the first mover's place in forward order.
    ``model_for(recipe)``: the recipe's eager transformers model; ``answers[(recipe, prompt)]``: its ids."""
    from harness.goldens.store import activation_golden_path, read_json_golden
    from harness.tolerances import observe

    records, localized = {}, {}
    for recipe in recipes:
        model = model_for(recipe)
        name, tol = activation_tolerance(recipe)
        for prompt, ids in prompt_ids.items():
            seq = list(ids) + list(answers[(recipe, prompt)])
            got = capture(model, seq)  # one forward for the new record and, where the ids agree, the comparison
            records[(recipe, prompt)] = record(model, seq, len(ids), got)
            path = activation_golden_path(recipe, prompt, key)
            if not path.is_file():
                continue
            golden = read_json_golden(path)
            found = moves(model, golden, got if golden["ids"] == seq else None)
            finite = [m.size for m in found if m.size != float("inf")]
            observe(name, max(finite, default=0.0))
            first = first_beyond(found, tol)
            localized[(recipe, prompt)] = (localize(found, tol, f"{recipe}:eager", golden.get("prompt_length", 0)),
                                           first is not None, found.index(first) if first else len(found))
    return records, localized


def eager_localization(model, recipe: str, prompt: str, key: str = "fixture") -> str | None:
    """The localization line of one recipe's eager model against its recorded activation golden of
    one prompt (None where the recipe has none: ``8da4w-fast`` runs another decoder)."""
    from harness.goldens.store import activation_golden_path, read_json_golden

    path = activation_golden_path(recipe, prompt, key)
    if recipe not in ACTIVATION_RECIPES or not path.is_file():
        return None
    golden = read_json_golden(path)
    return localize(moves(model, golden), activation_tolerance(recipe)[1], f"{recipe}:eager",
                    golden.get("prompt_length", 0))
