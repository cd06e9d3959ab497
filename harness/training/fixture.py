"""Train the committed tiny Gemma 4 fixture, deterministically, on the committed chat corpus.

    python -m harness.training.fixture [--out harness/fixture] [--check]

The committed weights are canonical: rerunning this script is how the fixture was made, but
tests never retrain. ``--check`` retrains into a temporary directory and reports whether the
result is byte-identical to the committed weights on this library stack.

Layout of the model (every feature of Gemma 4 E2B that export and quantization trip on):
per-layer input embeddings (``embed_tokens_per_layer`` + per-layer projection + norm), sliding
and full attention alternating with a larger head size on full-attention layers, one KV head,
KV sharing across the last two layers (the last non-shared layer full, the one before sliding,
as in E2B), double-wide MLP on shared layers, final logit softcapping 30, tied embeddings,
``gelu_pytorch_tanh``. Every quantized dimension is a multiple of 32.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "models" / "fixture"

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
BYTE_TOKENS = [f"<0x{i:02X}>" for i in range(256)]
VOCAB_SIZE = 1024

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] | trim }}<turn|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)

FIXTURE_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    vocab_size_per_layer_input=VOCAB_SIZE,
    hidden_size=128,
    hidden_size_per_layer_input=32,
    intermediate_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    global_head_dim=64,
    layer_types=[
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ],
    sliding_window=16,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    eos_token_id=[1, 5],
    bos_token_id=2,
)

SEED = 1234
LR = 3e-3
MAX_STEPS = 1500
MIN_MARGIN = 8.0  # top-1 minus top-2 logit at every answer position, to stop training
# Phase 2 (after MIN_MARGIN is reached): make the model lean on the E2B features a fixture trained
# on this corpus does not otherwise need (removing them flipped no answer): the same model with
# each feature removed (harness/training/ablations.py, parameters shared) must get some answer wrong by
# CONTRAST_MARGIN logits, while every answer keeps MIN_MARGIN.
CONTRAST_FEATURES = ("KV sharing", "the double-wide MLP", "the larger head size on full layers")
CONTRAST_TARGET = 3.0  # the hinge pushes the ablated model's soft-min answer margin below -3
CONTRAST_MARGIN = 2.0  # phase 2 stops once each removal leaves an answer trailing by 2 logits
CONTRAST_EVERY = 3  # the ablated passes run on every 3rd corpus row


def read_corpus(path: Path = FIXTURE_DIR / "corpus.jsonl") -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def build_tokenizer(corpus: list[dict], out_dir: Path) -> None:
    """A Gemma-style BPE: ``▁`` for spaces, byte fallback, ``Replace/ByteFallback/Fuse`` decoder."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=False))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS + BYTE_TOKENS,
        show_progress=False,
    )
    texts = []
    for row in corpus:
        texts += [row["prompt"], row["answer"], "user", "model"]
    tok.train_from_iterator(texts * 4, trainer=trainer)
    spec = json.loads(tok.to_str())
    # The Split pre-tokenizer only keeps merges inside words during training. ExecuTorch's
    # runner tokenizer (pytorch_tokenizers' HFTokenizer) rejects Split with MergedWithNext, so the
    # shipped file has none; that is exact only while no merge crosses a word boundary.
    for merge in spec["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        if "\u2581" in left[1:] or "\u2581" in right:
            raise RuntimeError(f"merge {merge!r} crosses a word boundary")
    spec["pre_tokenizer"] = None
    # Byte tokens live in the model vocab (for byte fallback), not as added special tokens.
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in SPECIAL_TOKENS]
    vocab = spec["model"]["vocab"]
    if len(vocab) > VOCAB_SIZE:
        raise RuntimeError(f"tokenizer vocab {len(vocab)} exceeds {VOCAB_SIZE}")
    # Pad the vocab to exactly VOCAB_SIZE so model and tokenizer agree (llama.cpp requires it).
    next_id = len(vocab)
    while next_id < VOCAB_SIZE:
        vocab[f"<unused{next_id}>"] = next_id
        next_id += 1
    (out_dir / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False, indent=1))
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<bos>",
                "eos_token": "<turn|>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "add_bos_token": False,
                "add_eos_token": False,
                "model_max_length": 512,
                "padding_side": "left",
            },
            indent=1,
        )
    )


def encode_example(tokenizer, prompt: str, answer: str | None = None) -> tuple[list[int], int]:
    """Token ids of a chat turn (and the answer, if given) and the index where the answer starts."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    start = len(ids)
    if answer is not None:
        ids = ids + tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<turn|>")]
    return ids, start


def train(out_dir: Path, log=print) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Gemma4ForCausalLM, Gemma4TextConfig, GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = read_corpus()
    build_tokenizer(corpus, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: reductions in a fixed order, so reruns are reproducible
    config = Gemma4TextConfig(**FIXTURE_CONFIG)
    config._attn_implementation = "eager"
    model = Gemma4ForCausalLM(config)
    model.train()

    examples = [encode_example(tokenizer, r["prompt"], r["answer"]) for r in corpus]
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.zeros(len(examples), width, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attention = torch.zeros(len(examples), width, dtype=torch.long)
    for i, (ids, start) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        labels[i, start : len(ids)] = torch.tensor(ids[start:])

    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    t0 = time.time()
    step = 0
    margin = float("-inf")
    phase2_from = None
    contrast_rows = torch.arange(0, len(examples), CONTRAST_EVERY)
    for step in range(1, MAX_STEPS + 1):
        out = model(input_ids=input_ids, attention_mask=attention, labels=labels, use_cache=False)
        loss = out.loss
        if phase2_from is not None:
            loss = loss + contrast_loss(model, out.logits, input_ids, labels, attention, contrast_rows)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            margin, exact = answer_margin(model, input_ids, labels, attention)
            ablated = ablated_margins(model, input_ids, labels, attention) if phase2_from is not None else {}
            log(f"step {step}: loss {out.loss.item():.4f}, min top-1 margin {margin:.2f}, exact {exact}"
                + "".join(f", without {k} {v:.2f}" for k, v in ablated.items()))
            if exact and margin >= MIN_MARGIN:
                if phase2_from is None:
                    phase2_from = step
                elif all(v <= -CONTRAST_MARGIN for v in ablated.values()):
                    break
    train_s = time.time() - t0
    torch.set_num_threads(threads)
    model.eval()

    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["architectures"] = ["Gemma4ForCausalLM"]
    cfg.pop("_attn_implementation_autoset", None)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    GenerationConfig(
        bos_token_id=2, eos_token_id=[1, 5], pad_token_id=0, do_sample=False
    ).save_pretrained(out_dir)
    return {"steps": step, "phase2_from": phase2_from, "train_seconds": round(train_s, 1),
            "min_margin": round(margin, 2)}


def _margins(logits, labels):
    """Committed token minus the best other token, at every answer position."""
    import torch

    logits, target = logits[:, :-1], labels[:, 1:]
    mask = target != -100
    gold = logits.gather(-1, target.clamp(min=0)[..., None])[..., 0]
    other = logits.scatter(-1, target.clamp(min=0)[..., None], torch.finfo(logits.dtype).min).max(-1).values
    return (gold - other)[mask]


def contrast_loss(model, logits, input_ids, labels, attention, rows):
    """Phase 2: every answer keeps MIN_MARGIN (+0.5), and with each CONTRAST_FEATURES removed some
    answer of ``rows`` trails by CONTRAST_TARGET (a soft minimum, so the gradient reaches them all)."""
    import torch

    from harness.training.ablations import removed

    loss = torch.relu(MIN_MARGIN + 0.5 - _margins(logits, labels)).mean()
    for feature in CONTRAST_FEATURES:
        with removed(model, feature):
            ablated = model(input_ids=input_ids[rows], attention_mask=attention[rows], use_cache=False).logits
        m = _margins(ablated, labels[rows])
        loss = loss + torch.relu(CONTRAST_TARGET - torch.logsumexp(-m, 0))
    return loss


def ablated_margins(model, input_ids, labels, attention) -> dict[str, float]:
    """The smallest answer margin over the corpus with each CONTRAST_FEATURES removed."""
    import torch

    from harness.training.ablations import removed

    out = {}
    with torch.no_grad():
        was_training = model.training
        model.eval()
        for feature in CONTRAST_FEATURES:
            with removed(model, feature):
                logits = model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits
            out[feature] = _margins(logits, labels).min().item()
        model.train(was_training)
    return out


def answer_margin(model, input_ids, labels, attention) -> tuple[float, bool]:
    """Teacher-forced: the smallest top-1 margin at any answer position, and whether all are right."""
    import torch

    with torch.no_grad():
        was_training = model.training
        model.eval()
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        model.train(was_training)
    target = labels[:, 1:]
    mask = target != -100
    top2 = logits.topk(2, dim=-1)
    right = top2.indices[..., 0] == target
    gold = logits.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    other = torch.where(right, top2.values[..., 1], top2.values[..., 0])
    margins = (gold - other)[mask]
    return margins.min().item(), bool(right[mask].all())


from harness.cache import sha256_file  # noqa: E402


def write_model_card(out_dir: Path, stats: dict) -> None:
    """MODEL_CARD.md: sha256 of the weights, the recipe, and each prompt's greedy answer."""
    import torch
    from transformers import AutoTokenizer

    from harness.models.load import load_fixture

    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    model = load_fixture(out_dir).model
    rows = []
    for r in read_corpus():
        ids, _ = encode_example(tokenizer, r["prompt"])
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
        new = gen[0, len(ids):].tolist()
        text = tokenizer.decode(new, skip_special_tokens=True)
        ok = "yes" if text == r["answer"] else "NO"
        rows.append(f"| {r['prompt']} | {text} | {ok} |")
    n_params = sum(p.numel() for p in model.parameters())
    card = f"""# Fixture: a tiny trained Gemma 4 text model

Canonical weights for the harness's `mac` tier. Made by `python -m harness.training.fixture`;
the committed files are canonical (tests never retrain), so a library upgrade cannot change them.

- weights: `model.safetensors`, sha256 `{sha256_file(out_dir / 'model.safetensors')}`
- parameters: {n_params:,} (tied embeddings counted once)
- architecture: `Gemma4ForCausalLM`, 6 layers (sliding ×3, full, sliding, full), hidden 128,
  4 query heads / 1 KV head, head_dim 32 (sliding) and 64 (full), sliding window 16,
  per-layer inputs 32 per layer, KV shared across the last 2 layers, double-wide MLP there,
  final logit softcapping 30, tied embeddings, gelu_pytorch_tanh, vocab {VOCAB_SIZE}
- tokenizer: Gemma-style BPE (`▁` spaces, byte fallback, Replace/ByteFallback/Fuse decoder),
  specials `<pad>`=0 `<eos>`=1 `<bos>`=2 `<unk>`=3 `<|turn>`=4 `<turn|>`=5 (end of turn, EOS)
- chat format: `<bos><|turn>user\\n{{prompt}}<turn|>\\n<|turn>model\\n`
- training: AdamW lr {LR}, full batch of the {len(read_corpus())} corpus rows, loss on answer
  tokens only, seed {SEED}, one thread, deterministic algorithms, eager attention. Phase 1 until
  every answer was right under teacher forcing with a top-1 margin of at least {MIN_MARGIN} logits
  (step {stats['phase2_from']}); phase 2 until, with each of {', '.join(CONTRAST_FEATURES)} removed
  (harness/training/ablations.py), some answer trails by at least {CONTRAST_MARGIN} logits while every answer
  keeps its margin: stopped at step {stats['steps']} ({stats['train_seconds']} s), smallest margin
  {stats['min_margin']}. tests/test_ablations.py holds every E2B feature to carrying weight.

## Greedy answers (HF `generate`, FP32)
| prompt | answer | matches corpus |
|---|---|---|
""" + "\n".join(rows) + "\n"
    (out_dir / "MODEL_CARD.md").write_text(card)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=FIXTURE_DIR)
    ap.add_argument("--check", action="store_true", help="retrain to a temp dir and compare hashes")
    args = ap.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            shutil.copy(FIXTURE_DIR / "corpus.jsonl", tmp / "corpus.jsonl")
            train(tmp)
            same = sha256_file(tmp / "model.safetensors") == sha256_file(FIXTURE_DIR / "model.safetensors")
            print("retrained weights identical to committed:", same)
            return 0 if same else 1
    stats = train(args.out)
    write_model_card(args.out, stats)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
