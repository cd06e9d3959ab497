"""A checkpoint with Gemma 4 E2B's exact text shape and seeded random weights, in the layout of the
real snapshot (``harness make-checkpoint --shape e2b DIR``): what every stage is measured on at
the real size when the real weights are not here.

The shape (``E2B_TEXT``) is the released E2B text configuration, checked against transformers
5.24's Gemma 4 code (configuration_gemma4.py / modeling_gemma4.py; most of its defaults are *not*
E2B's: hidden 2304, 30 layers, 4 KV heads, 5:1 layers, no softcap) and public descriptions of the
release: hidden 1536, intermediate 6144 (12288, double-wide, in the 20 KV-shared layers), 35 layers
in a 4 sliding : 1 full pattern, 8 heads and 1 KV head, head dims 256 (sliding) / 512 (full,
``global_head_dim``), sliding window 512, per-layer inputs 256 over 262,144 ids, vocabulary
262,144, final-logit softcap 30, tied embeddings, RoPE theta 10k (sliding) and 1M proportional
with a quarter of the dimensions rotated (full). Text model: 4,628,569,344 parameters, of which
the per-layer table is 2,348,810,240 and ``embed_tokens`` 402,653,184 (``lm_head`` is tied).

Weights: N(0, ``initializer_range`` = 0.02) for every matrix, ones for every RMSNorm (Gemma 4
multiplies by the weight, not by 1 + weight) and ``layer_scalar``: transformers' own init, which
keeps the residual stream bounded through the post-norms (tests/test_synthetic_checkpoint.py
measures it on the small shape), except the attention's ``q_norm`` and ``k_norm``, which are
``head_dim ** -0.25`` (``QK_NORM``). Gemma 4 attends with ``scaling = 1.0``: the usual
``1/sqrt(head_dim)`` lives in the trained q/k norm weights. At init (ones) the attention logits of
unit-RMS queries and keys have a standard deviation of ``sqrt(head_dim)``, 16 and 23 at E2B's head
dims, so every softmax is nearly one-hot and a rounding flips which slot it picks: a random E2B is
chaotic, a trained one is not. Measured (FP32, a 1e-6 nudge of the embeddings, E2B's 35 layers
and head dims at hidden 128): the logits move 3,792x the nudge with ones, 1.6x with ``QK_NORM``
(tests/test_synthetic_checkpoint.py keeps both); at E2B's width, 8da4w, 64 tokens, a 1e-6 nudge
moved the logits 2.60 with ones and 0.19 with ``QK_NORM``.
Each tensor is drawn from its own seed (the run's seed and the tensor's name), in row chunks into
bf16, and handed to the shard writer one at a time, so memory holds about one shard, never the
model. The tokenizer is the fixture's, its ids moved so the specials sit where Gemma's do (pad 0,
eos 1, bos 2, unk 3, ``<|turn>`` 105, ``<turn|>`` 106) and padded with ``<unused_N>`` pieces to the
vocabulary size.

``--shape small`` is the same architecture at toy size, for tests, with one difference: its final
norm's weights are ``FINAL_NORM["small"]`` (50), not ones. A random model's answers are all
near-ties (top-2 margins under 0.2 logits on the default prompts), so the refresh gate, which
refuses a token change only where the margin is clear (``refresh/near_tie``, 2.5), could never
refuse one on it. Scaling the final norm scales every logit before the softcap: the same greedy
answers, margins up to 5 (measured on the 4 default prompts, bf16), like a trained model's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from harness.errors import HarnessError

E2B_LAYERS = 35
E2B_TEXT: dict = {
    "model_type": "gemma4_text", "dtype": "bfloat16",
    "vocab_size": 262144, "hidden_size": 1536, "intermediate_size": 6144,
    "num_hidden_layers": E2B_LAYERS, "num_attention_heads": 8, "num_key_value_heads": 1,
    "head_dim": 256, "global_head_dim": 512,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
    "initializer_range": 0.02, "rms_norm_eps": 1e-06, "use_cache": True,
    "pad_token_id": 0, "eos_token_id": [1, 106], "bos_token_id": 2, "tie_word_embeddings": True,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    "attention_bias": False, "attention_dropout": 0.0, "sliding_window": 512,
    "layer_types": ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(E2B_LAYERS)],
    "final_logit_softcapping": 30.0,
    "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": False, "num_kv_shared_layers": 20, "enable_moe_block": False, "use_double_wide_mlp": True,
}
SMALL_LAYERS = 10
SMALL_TEXT: dict = {
    **E2B_TEXT, "vocab_size": 2048, "vocab_size_per_layer_input": 2048, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": SMALL_LAYERS, "num_attention_heads": 4, "head_dim": 16, "global_head_dim": 32,
    "sliding_window": 8, "hidden_size_per_layer_input": 32, "num_kv_shared_layers": 4, "max_position_embeddings": 512,
    "layer_types": ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(SMALL_LAYERS)],
}
SHAPES = {"e2b": E2B_TEXT, "small": SMALL_TEXT}
E2B_TEXT_PARAMETERS = 4_628_569_344
SPECIAL_IDS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<|turn>": 105, "<turn|>": 106}
CHUNK_ELEMENTS = 1 << 26  # rows drawn at a time: 256 MB of float32
QK_NORM = -0.25  # q_norm and k_norm weights are head_dim ** QK_NORM (the module docstring says why)
WEIGHTS = ("seeded random: N(0, initializer_range) matrices, ones for norms and layer scalars, "
           "head_dim^-1/4 for the attention's q_norm and k_norm")
FINAL_NORM = {"small": 50.0}  # the final norm's weights per shape (the module docstring says why); else ones


def weights_scheme(shape: str) -> str:
    """What the marker records of how the weights were drawn (a change makes older ones stale)."""
    scale = FINAL_NORM.get(shape)
    return WEIGHTS + (f"; final norm weights {scale:g}" if scale else "")


def text_config(shape: str) -> dict:
    if shape not in SHAPES:
        raise HarnessError(f"no checkpoint shape {shape!r}", f"choose one of {', '.join(SHAPES)}")
    return json.loads(json.dumps(SHAPES[shape]))


def tensor_shapes(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(checkpoint name, shape, kind) of every text tensor transformers builds for ``config``, in
    its order, from a model on the meta device (nothing allocated). kind: matrix, norm, qk_norm or
    scalar."""
    import torch
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel

    from harness.models.checkpoint import TEXT_PREFIX

    cfg = Gemma4TextConfig(**{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = Gemma4TextModel(cfg)
    out = []
    for name, t in model.state_dict().items():
        if name.endswith("inv_freq"):
            continue
        kind = ("scalar" if name.endswith("layer_scalar") else "qk_norm" if name.endswith(("q_norm.weight", "k_norm.weight"))
                else "norm" if t.dim() == 1 else "matrix")
        out.append((TEXT_PREFIX + name, tuple(t.shape), kind))
    return out


def parameter_count(config: dict) -> int:
    import math

    return sum(math.prod(shape) for _, shape, kind in tensor_shapes(config) if kind != "scalar")


def _seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def random_tensor(name: str, shape: tuple[int, ...], kind: str, std: float, seed: int):
    """One tensor in bf16: N(0, std) for a matrix (drawn in row chunks, so a 2.35B-entry table
    never exists in float32), ``head_dim ** QK_NORM`` for a q/k norm, ones for a norm or scalar."""
    import torch

    if kind == "qk_norm":
        return torch.full(shape, shape[-1] ** QK_NORM, dtype=torch.bfloat16)
    if kind != "matrix":
        return torch.ones(shape, dtype=torch.bfloat16)
    out = torch.empty(shape, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(_seed(seed, name))
    rows = max(1, CHUNK_ELEMENTS // max(1, shape[-1]))
    flat = out.view(-1, shape[-1])
    for start in range(0, flat.shape[0], rows):
        block = torch.randn((min(rows, flat.shape[0] - start), shape[-1]), generator=gen) * std
        flat[start:start + block.shape[0]] = block.to(torch.bfloat16)
    return out


def random_weights(config: dict, seed: int = 0, shapes=None, before=None, final_norm: float = 1.0):
    """(checkpoint name, bf16 tensor) for every text tensor of ``config``, one at a time;
    ``before(i, name, dims)`` is called before each is drawn. ``final_norm``: the final norm's weights."""
    from harness.models.checkpoint import TEXT_PREFIX

    std = float(config["initializer_range"])
    for i, (name, dims, kind) in enumerate(shapes or tensor_shapes(config)):
        if before is not None:
            before(i, name, dims)
        t = random_tensor(name, dims, kind, std, seed)
        yield name, (t * final_norm if name == TEXT_PREFIX + "norm.weight" else t)


def write_tokenizer(out: Path, vocab_size: int) -> None:
    """The fixture's tokenizer with Gemma's special ids and ``vocab_size`` entries: its other
    pieces keep their order after the specials, and ``<unused_N>`` fills the rest."""
    from harness.models.load import FIXTURE_DIR

    tok = json.loads((FIXTURE_DIR / "tokenizer.json").read_text())
    old = tok["model"]["vocab"]
    if vocab_size < max(SPECIAL_IDS.values()) + len(old):
        raise HarnessError(f"a vocabulary of {vocab_size} cannot hold the fixture's {len(old)} pieces and "
                           "Gemma's special ids", "use a larger vocab_size")
    order = [p for p, _ in sorted(old.items(), key=lambda kv: kv[1]) if p not in SPECIAL_IDS]
    vocab = dict(SPECIAL_IDS)
    free = (i for i in range(vocab_size) if i not in SPECIAL_IDS.values())
    for piece in order:
        vocab[piece] = next(free)
    for n, i in enumerate(free):
        vocab[f"<unused_{n}>"] = i
    tok["model"]["vocab"] = vocab
    for added in tok["added_tokens"]:
        added["id"] = vocab[added["content"]]
    post = tok.get("post_processor") or {}
    for special in (post.get("special_tokens") or {}).values():
        special["ids"] = [vocab[t] for t in special.get("tokens", [])]
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (FIXTURE_DIR / name).is_file():
            shutil.copyfile(FIXTURE_DIR / name, out / name)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": SPECIAL_IDS["<bos>"], "eos_token_id": [SPECIAL_IDS["<eos>"], SPECIAL_IDS["<turn|>"]],
         "pad_token_id": SPECIAL_IDS["<pad>"], "do_sample": False}, indent=2) + "\n")


def checkpoint_bytes(config: dict) -> int:
    """The bf16 bytes of every text tensor: what the checkpoint holds on disk, within its headers."""
    import math

    return sum(math.prod(shape) * 2 for _, shape, _ in tensor_shapes(config))


MARKER = "harness_synthetic.json"


def make_checkpoint(out: Path, shape: str = "e2b", seed: int = 0, shard_bytes: int = 2 << 30, progress=print) -> Path:
    """Write the checkpoint: built beside ``out`` (the shard writer reads every shard back), the
    marker added, then renamed into place; an interrupted run leaves no ``out``."""
    import os
    import tempfile

    from harness.models.checkpoint import write_checkpoint

    config = text_config(shape)
    shapes = tensor_shapes(config)
    need = checkpoint_bytes(config)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HarnessError(f"{out} exists and is not an empty directory", "pass a new directory, or remove it first")
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if free < need * 1.05:
        raise HarnessError(f"{out.parent} has {free / 1e9:.1f} GB free; the {shape} checkpoint needs {need / 1e9:.1f} GB",
                           "free some disk or pass a directory on another one")

    def before(i, name, dims):
        if len(shapes) > 100 and (i % 100 == 0 or dims[0] * dims[-1] > 1 << 28):
            progress(f"make-checkpoint: tensor {i + 1}/{len(shapes)} {name} {list(dims)}")

    building = out.with_name(f".{out.name}.making-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    try:
        with tempfile.TemporaryDirectory(prefix=".tokenizer-", dir=out.parent) as tok_dir:
            write_tokenizer(Path(tok_dir), int(config["vocab_size"]))
            config["eos_token_id"] = [SPECIAL_IDS["<eos>"], SPECIAL_IDS["<turn|>"]]
            write_checkpoint(building, config, random_weights(config, seed, shapes, before, FINAL_NORM.get(shape, 1.0)), Path(tok_dir),
                             shard_bytes=shard_bytes, dtype="bfloat16")
        (building / MARKER).write_text(json.dumps(
            {"shape": shape, "seed": seed, "bytes": need, "written_by": "harness make-checkpoint",
             "weights": weights_scheme(shape)},
            indent=1) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(building, out)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return out


def is_synthetic(directory: Path) -> bool:
    """Whether a checkpoint directory was generated here (agreement applies; real goldens do not)."""
    return (Path(directory) / MARKER).is_file()


def stale_weights(directory: Path) -> str | None:
    """Why a generated checkpoint's weights cannot carry an agreement check (None when they can):
    one written before ``QK_NORM`` (q/k norms of ones) is chaotic, so the .pte and eager part from
    rounding alone."""
    try:
        marker = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        marker = None
    if not isinstance(marker, dict):
        return f"{directory}/{MARKER} is unreadable or not a JSON object; regenerate the checkpoint (harness make-checkpoint)"
    if marker.get("weights") != weights_scheme(marker.get("shape", "e2b")):
        return (f"{directory} holds an older weight scheme ({marker.get('weights')!r}), chaotic under rounding; "
                f"regenerate it: harness make-checkpoint --shape {marker.get('shape', 'e2b')} NEW_DIR")
    return None
