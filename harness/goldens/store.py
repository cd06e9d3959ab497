"""Goldens: what each stage said, compared with what it said before, and explained when it changed.

Every golden is keyed by data, never by a test's name: (model, recipe, stage, prompt).

    goldens/tokens/MODEL/RECIPE/STAGE/SLUG.json   the prompt, the greedy ids and their text
    goldens/logits/MODEL/RECIPE/STAGE/SLUG.json   at every generated position: the top-5 ids and
                                                  log-probs (readable) and the whole logit vector
                                                  (float32, base64), compared with tolerances.py
    goldens/prompts/MODEL/SLUG.json               the chat-templated prompt text and its ids
    goldens/quality/MODEL/RECIPE.json             KL divergence from fp32 and same-top-1 rate
    goldens/provenance.json                       the stack they were recorded under, and every
                                                  refresh accepted over the gate's objection
    goldens/provenance/MODEL.json                 the same for a user's checkpoint (MODEL is its
                                                  id, NAME-HASH12), with its prompts and recipes

A user's checkpoint (262,144 logits per position at E2B) keeps a compact logit record instead of
the whole vector (``logit_record(gen, compact=True)``): the top 256 log-probs exactly, a signed
sketch of every centred logit (256 tokens a bucket), and the logits' mean.

Only ``harness goldens update`` writes them (``harness/goldens/refresh.py``, the gate).
``HARNESS_GOLDENS_DIR`` points everything at another copy (the harness's own tests use it).
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

from harness.errors import HarnessError

STAGES = ("hf_generate", "eager", "exported", "pte")
# The prompts every golden is recorded for: a sample of the fixture corpus (5 for the benchmark
# protocol, one that is not a capital, and one whose chat-templated prompt is longer than the
# fixture's 16-slot sliding window, so that prefill itself crosses the window edge).
GOLDEN_PROMPTS = (
    "What is the capital of France?",
    "What is the capital of Japan?",
    "What is the capital of India?",
    "What is the capital of Mexico?",
    "Who wrote Hamlet?",
    "What is the boiling point of water?",
    "What color is the sky on a clear day?",
)
FIXTURE_PROMPTS = GOLDEN_PROMPTS  # the name the rest of the harness knew them by
MAX_NEW_TOKENS = 9  # as the deployment log's reference answer
TOP_K = 5
UPDATE_COMMAND = "harness goldens update"


def goldens_dir() -> Path:
    """The committed goldens, unless HARNESS_GOLDENS_DIR names another copy (read at each call)."""
    env = os.environ.get("HARNESS_GOLDENS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "goldens"


def predecessor(recipe: str, stage: str) -> tuple[str, str] | None:
    """The stage whose output this one must reproduce: the previous stage of the same recipe, and
    for a quantized recipe's first stage, the FP32 recipe's first stage (the quantize step)."""
    i = STAGES.index(stage)
    if i > 0:
        return recipe, STAGES[i - 1]
    if recipe != "fp32":
        return "fp32", STAGES[0]
    return None


def chain(recipes) -> list[tuple[str, str]]:
    """Every (recipe, stage) in the order a change is localized: fp32 first, stage by stage."""
    ordered = sorted(recipes, key=lambda r: (r != "fp32", r))
    return [(r, s) for r in ordered for s in STAGES]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48]


# ---- where each golden lives ------------------------------------------------------------------
def token_golden_path(recipe: str, stage: str, prompt: str, model: str = "fixture") -> Path:
    return goldens_dir() / "tokens" / model / recipe / stage / f"{slug(prompt)}.json"


def logit_golden_path(recipe: str, stage: str, prompt: str, model: str = "fixture") -> Path:
    return goldens_dir() / "logits" / model / recipe / stage / f"{slug(prompt)}.json"


def activation_golden_path(recipe: str, prompt: str, model: str = "fixture") -> Path:
    return goldens_dir() / "activations" / model / recipe / f"{slug(prompt)}.json"


def prompt_golden_path(prompt: str, model: str = "fixture") -> Path:
    return goldens_dir() / "prompts" / model / f"{slug(prompt)}.json"


def quality_golden_path(recipe: str, model: str = "fixture") -> Path:
    return goldens_dir() / "quality" / model / f"{recipe}.json"


def provenance_path(model: str = "fixture") -> Path:
    """The fixture's ``provenance.json``; a checkpoint's ``provenance/MODEL.json``."""
    return goldens_dir() / "provenance.json" if model == "fixture" else model_provenance_dir() / f"{model}.json"


def model_provenance_dir() -> Path:
    return goldens_dir() / "provenance"


def read_json_golden(path: Path):
    if not path.is_file():
        raise HarnessError(f"golden {path} does not exist",
                           f"record the goldens with: {UPDATE_COMMAND} (docs/goldens.md)")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise HarnessError(f"golden {path} is malformed JSON ({e})",
                           f"restore it from git, or re-record with: {UPDATE_COMMAND}") from e


def golden_ids(recipe: str, stage: str, prompt: str, model: str = "fixture") -> list[int]:
    """The committed greedy ids of one stage for one prompt."""
    record = read_json_golden(token_golden_path(recipe, stage, prompt, model))
    ids = record.get("ids") if isinstance(record, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise HarnessError(f"golden {token_golden_path(recipe, stage, prompt, model)} has no list of ids",
                           "restore it from git")
    return ids


def encode_json(data) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def write_json_golden(path: Path, data) -> None:
    from harness.atomic import write_bytes_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, encode_json(data))


# ---- records ----------------------------------------------------------------------------------
def token_record(prompt: str, ids: list[int], tokenizer) -> dict:
    return {"prompt": prompt, "ids": [int(i) for i in ids],
            "text": tokenizer.decode(ids, skip_special_tokens=True)}


def prompt_record(prompt: str, tokenizer) -> dict:
    """What the chat template and the tokenizer make of a prompt: the rendered text and its ids."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                         add_generation_prompt=True, tokenize=False)
    return {"prompt": prompt, "rendered": text, "ids": tokenizer.encode(text, add_special_tokens=False)}


def pack_logits(vector) -> str:
    import numpy as np

    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


def unpack_logits(text: str):
    import numpy as np
    import torch

    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype="<f4").copy())


def logit_record(gen, compact: bool = False) -> list[dict]:
    """At each generated position: the top-5 ids and log-probs (6 decimals, for people) and, for
    the comparison, the whole logit vector (float32), or with ``compact`` the compact record."""
    out = []
    for logits in gen.step_logits:
        logits = logits.float()
        lp = logits.log_softmax(-1)
        top = lp.topk(TOP_K)
        row = {"ids": [int(i) for i in top.indices], "logprobs": [round(float(v), 6) for v in top.values]}
        row.update(compact_logits(logits) if compact else {"logits": pack_logits(logits.numpy())})
        out.append(row)
    return out


# ---- the compact logit record -----------------------------------------------------------------
# At a 262,144-token vocabulary a whole float32 vector is 1 MB per position: 4 prompts x 9
# positions x 4 stages would be 150 MB of goldens per recipe. What the comparisons need instead:
# - the top HEAD_K log-probs and their ids, exactly: every token an answer could pick, and the
#   top-2 margins the gate reads;
# - a signed sketch of the whole vector: token i adds sign(i) * (logit_i - mean) to bucket(i), with
#   SKETCH_BUCKET tokens a bucket (fixed hashes of the id). A token anywhere in the tail rising by
#   1 nat moves its bucket by 1, while benign noise grows only with the bucket's random walk
#   (``logit_golden/sketch``); centring makes it blind to a constant shift, which ...
# - ... the logits' mean catches (the bias the full record compared).
# 256 + 1,024 floats and 256 ids: about 9 KB of JSON a position at E2B, 1.3 MB for 4 prompts x
# 9 positions x 4 stages.
HEAD_K = 256
SKETCH_BUCKET = 256


def sketch_layout(vocab: int):
    """(bucket index, sign) per token id: multiplicative hashes of the id, the same everywhere."""
    import torch

    ids = torch.arange(vocab, dtype=torch.int64)
    buckets = max(1, -(-vocab // SKETCH_BUCKET))
    index = ((ids * 0x9E3779B1) & 0xFFFFFFFF) % buckets
    sign = ((((ids * 0x85EBCA6B) & 0xFFFFFFFF) >> 16) & 1).float() * 2 - 1
    return index, sign, buckets


def sketch(logits):
    import torch

    logits = logits.float()
    index, sign, buckets = sketch_layout(logits.numel())
    centred = (logits - logits.mean()).double() * sign.double()
    return torch.zeros(buckets, dtype=torch.float64).index_add_(0, index, centred).float()


def compact_logits(logits) -> dict:
    lp = logits.float().log_softmax(-1)
    head = lp.topk(min(HEAD_K, lp.numel()))
    return {"head_ids": [int(i) for i in head.indices], "head_logprobs": pack_logits(head.values.numpy()),
            "sketch": pack_logits(sketch(logits).numpy()), "mean": float(logits.float().mean()),
            "vocab": int(lp.numel())}


# ---- the quantize stage itself ----------------------------------------------------------------
def quantize_golden_path(recipe: str, model: str = "fixture") -> Path:
    return goldens_dir() / "quantize" / model / f"{recipe}.json"


def quantize_record(model, digest_scales: bool = False) -> dict:
    """Every quantized tensor of a model as torchao made it: its scales (float32, base64) and a
    sha256 of its integer codes and zero points. A quantized model's logits move by 0.3 under a
    1e-6 nudge upstream (INT8 activation codes flip), so a 10% change of one scale hides in them;
    here it is exact. ``digest_scales`` (a user's checkpoint: E2B has 145 million scales, 770 MB
    as JSON): the scales too as a sha256, so any change of a scale is named, exactly, without the
    relative tolerance the fixture's stored scales allow."""
    import hashlib

    out = {}
    seen = set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        names = getattr(t, "tensor_data_names", None)
        if not names or id(t) in seen:
            continue
        seen.add(id(t))
        rec = {"type": type(t).__name__}
        for part in names:
            data = getattr(t, part, None)
            if data is None:
                continue
            if part == "scale" and not digest_scales:
                rec["scale"] = pack_logits(data.detach().float().reshape(-1).numpy())
                rec["scale_shape"] = list(data.shape)
            else:
                rec[f"{part}_sha256"] = hashlib.sha256(data.detach().contiguous().numpy().tobytes()).hexdigest()
                rec[f"{part}_shape"] = list(data.shape)
        out[name] = rec
    return out


