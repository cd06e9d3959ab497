"""Goldens: what each stage said, compared with what it said before, and explained when it changed.

Token goldens are syrupy JSON snapshots (ids and text only) under ``goldens/tokens/``; logit
goldens (top-5 ids and their log-probabilities at every generated position) are numeric JSON
files under ``goldens/logits/`` compared with the tolerance table; ``goldens/provenance.json``
records the stack they were produced under. Only ``pytest --snapshot-update`` writes any of them.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

# HARNESS_GOLDENS_DIR points verify, goldens diff and the golden tests at another copy (tests of
# the harness itself use it; the committed goldens are the default).
GOLDENS_DIR = Path(os.environ.get("HARNESS_GOLDENS_DIR") or Path(__file__).resolve().parent.parent / "goldens")
STAGES = ("hf_generate", "eager", "exported", "pte")
# The prompts every golden is recorded for: a sample of the fixture corpus (5 for the benchmark
# protocol, plus one that is not a capital).
FIXTURE_PROMPTS = (
    "What is the capital of France?",
    "What is the capital of Japan?",
    "What is the capital of India?",
    "What is the capital of Mexico?",
    "Who wrote Hamlet?",
    "What is the boiling point of water?",
)
TOP_K = 5


def predecessor(recipe: str, stage: str) -> tuple[str, str] | None:
    """The stage whose output this one must reproduce: the previous stage of the same recipe, and
    for a quantized recipe's first stage, the FP32 recipe's first stage (the quantize step)."""
    i = STAGES.index(stage)
    if i > 0:
        return recipe, STAGES[i - 1]
    if recipe != "fp32":
        return "fp32", STAGES[0]
    return None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48]


def token_record(ids: list[int], tokenizer) -> dict:
    return {"ids": [int(i) for i in ids], "text": tokenizer.decode(ids, skip_special_tokens=True)}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margin_at(gen, position: int) -> float | None:
    """Top-1 minus top-2 logit at a generated position (None if not recorded)."""
    if gen is None or position >= len(gen.step_logits):
        return None
    top = gen.step_logits[position].float().topk(2).values
    return float(top[0] - top[1])


def _tok(tokenizer, tid: int | None) -> str:
    if tid is None:
        return "(none: generation ended)"
    return f"{tid} {tokenizer.decode([tid])!r}"


def explain(recipe: str, stage: str, runs: dict, tokenizer) -> str:
    """Walk back along the stage chain to the first stage that differs from the stage before it,
    and describe where and how: position, both tokens, the top-2 logit margin there."""
    node = (recipe, stage)
    culprit = None
    while (prev := predecessor(*node)) is not None:
        a, b = runs.get(prev), runs.get(node)
        if a is None or b is None:
            break
        if a.ids != b.ids:
            culprit = (prev, node)
        node = prev
    if culprit is None:
        return "every stage before it agrees with the stage before it (the golden itself changed?)"
    prev, node = culprit
    a, b = runs[prev], runs[node]
    pos = first_divergence(a.ids, b.ids)
    want = a.ids[pos] if pos < len(a.ids) else None
    got = b.ids[pos] if pos < len(b.ids) else None
    m_prev, m_node = margin_at(a, pos), margin_at(b, pos)
    text = (f"stage {node[0]}:{node[1]} first diverged from {prev[0]}:{prev[1]} at generated position "
            f"{pos}: {prev[1]} said {_tok(tokenizer, want)}, {node[1]} said {_tok(tokenizer, got)}")
    if m_prev is not None:
        text += f"; top-2 logit margin there {m_prev:.3f} in {prev[1]}"
        if m_node is not None:
            text += f", {m_node:.3f} in {node[1]}"
        text += " (a near-tie: numerics, not necessarily a bug)" if m_prev < 0.5 else " (a clear margin: a regression)"
    return text


def check_tokens(golden_ids: list[int], gen, tokenizer, label: str) -> str | None:
    """None if ``gen`` reproduces the golden ids, else one line: position, both tokens, margin."""
    pos = first_divergence(golden_ids, gen.ids)
    if pos is None:
        return None
    want = golden_ids[pos] if pos < len(golden_ids) else None
    got = gen.ids[pos] if pos < len(gen.ids) else None
    m = margin_at(gen, pos)
    return (f"{label} diverged from the golden at generated position {pos}: golden {_tok(tokenizer, want)}, "
            f"got {_tok(tokenizer, got)}" + (f"; top-2 margin there {m:.3f}" if m is not None else "")
            + f"; golden text {tokenizer.decode(golden_ids, skip_special_tokens=True)!r}, "
            f"got {tokenizer.decode(gen.ids, skip_special_tokens=True)!r}")


# ---- logit goldens ----------------------------------------------------------------------------
def logit_record(gen) -> list[dict]:
    """Top-5 ids and log-probs (6 decimals) at each generated position."""
    out = []
    for logits in gen.step_logits:
        lp = logits.float().log_softmax(-1)
        top = lp.topk(TOP_K)
        out.append({"ids": [int(i) for i in top.indices], "logprobs": [round(float(v), 6) for v in top.values]})
    return out


@dataclass
class LogitMismatch:
    position: int
    token_id: int
    golden: float
    actual: float

    def __str__(self) -> str:
        return (f"position {self.position}, token {self.token_id}: log-prob {self.actual:.4f}, "
                f"golden {self.golden:.4f} (|diff| {abs(self.actual - self.golden):.4f})")


def compare_logits(golden: list[dict], gen, atol: float) -> list[LogitMismatch]:
    """Look up each golden top-5 id's log-prob in the new distribution: robust to rank swaps
    among near-equal low-probability tokens, strict on every value that matters."""
    bad = []
    for pos, rec in enumerate(golden):
        if pos >= len(gen.step_logits):
            bad.append(LogitMismatch(pos, rec["ids"][0], rec["logprobs"][0], math.nan))
            continue
        lp = gen.step_logits[pos].float().log_softmax(-1)
        for tid, want in zip(rec["ids"], rec["logprobs"]):
            got = float(lp[tid])
            if not abs(got - want) <= atol:
                bad.append(LogitMismatch(pos, tid, want, got))
    return bad


def logit_golden_path(model: str, recipe: str, stage: str, prompt: str) -> Path:
    return GOLDENS_DIR / "logits" / model / recipe / stage / f"{slug(prompt)}.json"


def read_json_golden(path: Path):
    if not path.is_file():
        raise HarnessError(f"golden {path} does not exist", "record goldens with: pytest -m mac --snapshot-update")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise HarnessError(f"golden {path} is malformed JSON ({e})",
                           "restore it from git, or re-record with: pytest -m mac --snapshot-update") from e


def write_json_golden(path: Path, data) -> None:
    from harness.atomic import write_bytes_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


# ---- provenance -------------------------------------------------------------------------------
PROVENANCE = GOLDENS_DIR / "provenance.json"


def current_provenance(fixture_sha256: str) -> dict:
    from harness import __version__
    from harness.versions import library_versions

    libs = library_versions()
    return {
        "torch": libs["torch"],
        "transformers": libs["transformers"],
        "torchao": libs["torchao"],
        "executorch": libs["executorch"],
        "fixture_weights_sha256": fixture_sha256,
        "harness": __version__,
    }


def provenance_diff(recorded: dict, current: dict) -> dict[str, tuple]:
    return {k: (recorded.get(k), current.get(k)) for k in sorted(set(recorded) | set(current))
            if recorded.get(k) != current.get(k)}


REFRESH_HINT = ("to refresh: tox -e refresh (diffs every golden stage on the new stack, then runs the suite), "
                "and accept with pytest -m mac --snapshot-update only if the first diverging stage is the "
                "upgraded one at a near-tie (README, 'Goldens and the refresh flow')")


def stack_note(recorded: dict | None = None, now: dict | None = None) -> str:
    """One line for a failed golden: "" when the goldens were recorded under this very stack,
    otherwise which versions differ (recorded → running) and how to refresh."""
    if recorded is None:
        if not PROVENANCE.is_file():
            return f"the goldens have no provenance record ({PROVENANCE} is missing); {REFRESH_HINT}"
        try:
            recorded = json.loads(PROVENANCE.read_text())
        except ValueError as e:
            return f"{PROVENANCE} is malformed JSON ({e}); restore it from git"
        if not isinstance(recorded, dict):
            return f"{PROVENANCE} is not a JSON object; restore it from git"
    if now is None:
        from harness.cache import sha256_file
        from harness.load import FIXTURE_DIR

        now = current_provenance(sha256_file(FIXTURE_DIR / "model.safetensors"))
    diff = provenance_diff(recorded, now)
    if not diff:
        return ""
    parts = [f"{k} {a} -> {b}" for k, (a, b) in diff.items()]
    return (f"the goldens were recorded under another stack ({', '.join(parts)}; recorded -> running); "
            + REFRESH_HINT)

