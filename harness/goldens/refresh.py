"""``harness goldens diff`` and ``harness goldens update``: recompute the whole golden set on this
stack, say what changed (localized), and rewrite the goldens only through the gate.

The gate accepts a refresh only when every change is numerics, not behaviour:
- a token change only where the new run's top-2 margin at the first diverging position is a near-tie
  (``refresh/near_tie``), or where the stage merely follows its predecessor, which changed acceptably
  (it agreed with it before and still does);
- logit changes within ``refresh/logit_multiple`` times their golden's tolerance;
- the rendered prompts and their ids unchanged (a template or tokenizer change is behaviour);
- quantization quality (KL from fp32, same-top-1) within its budget;
- llama.cpp's independent top-5 agreeing with the new fp32 goldens.
Otherwise it says what blocks and why, and writes nothing. ``--allow REASON`` writes anyway and
appends the reason, what was blocked, the date and both stacks to ``provenance.json``.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.goldens.checks import _tok, is_near_tie, logit_golden_diff, first_divergence, margin_at, quality, check_quantize_golden, check_quality_golden
from harness.goldens.provenance import STACK_KEYS, current_provenance, provenance_diff, recorded_provenance
from harness.goldens.store import GOLDEN_PROMPTS, MAX_NEW_TOKENS, STAGES, UPDATE_COMMAND, chain, encode_json, goldens_dir, logit_golden_path, logit_record, predecessor, prompt_golden_path, prompt_record, quality_golden_path, quantize_golden_path, quantize_record, read_json_golden, token_golden_path, token_record
from harness.recipes import GOLDEN_RECIPES, RECIPES
from harness.tolerances import tolerance

QUANTIZED = tuple(name for name, r in RECIPES.items() if r.linear is not None)


@dataclass
class Computed:
    """Everything the goldens record, as this stack computes it."""
    runs: dict  # (recipe, stage, prompt) -> Generation
    prompts: dict  # prompt -> prompt record
    quality: dict  # recipe -> quality record
    quantized: dict  # recipe -> quantize record (torchao's codes and scales)
    tokenizer: object
    provenance: dict

    def files(self) -> dict[Path, object]:
        """Every golden file (path -> JSON data) but provenance.json."""
        out: dict[Path, object] = {}
        for (recipe, stage, prompt), gen in self.runs.items():
            out[token_golden_path(recipe, stage, prompt)] = token_record(prompt, gen.ids, self.tokenizer)
            out[logit_golden_path(recipe, stage, prompt)] = logit_record(gen)
        for prompt, record in self.prompts.items():
            out[prompt_golden_path(prompt)] = record
        for recipe, record in self.quality.items():
            out[quality_golden_path(recipe)] = record
        for recipe, record in self.quantized.items():
            out[quantize_golden_path(recipe)] = record
        return out


def quality_sequences(prompts=None) -> dict[str, list[tuple[list[int], int]]]:
    """Teacher-forced sequences for the quality statistics: the golden prompts and the whole
    corpus, each chat-templated prompt followed by its corpus answer and end of turn; the int is
    where the answer starts."""
    from harness.models.spec import load_model
    from harness.training.fixture import encode_example, read_corpus

    tok = load_model("fixture").tokenizer
    rows = read_corpus()
    answers = {r["prompt"]: r["answer"] for r in rows}
    golden = [encode_example(tok, p, answers[p]) for p in (prompts or GOLDEN_PROMPTS)]
    return {"golden_prompts": golden, "corpus": [encode_example(tok, r["prompt"], r["answer"]) for r in rows]}


def quality_record(reference_step, step) -> dict:
    """Per set of sequences: KL(fp32 || recipe) over every answer position, and same-top-1."""
    import torch

    out = {}
    for name, seqs in quality_sequences().items():
        refs, news = [], []
        with torch.no_grad():
            for ids, start in seqs:
                x, pos = torch.tensor([ids]), torch.arange(len(ids))
                refs.append(reference_step(x, pos)[0, start - 1:-1].float())
                news.append(step(x, pos)[0, start - 1:-1].float())
        stats = quality(torch.cat(refs), torch.cat(news))
        out[name] = {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in stats.items()}
    return out


def compute(run=None, pipeline=None, progress=print, with_quality: bool = True) -> Computed:
    """The whole golden set on this stack. ``run(recipe, stage, prompt)`` and ``pipeline(recipe)``
    default to fresh Pipelines (the tests pass their session's, so nothing is computed twice)."""
    if pipeline is None:
        from harness.pipeline import Pipeline

        made: dict = {}

        def pipeline(recipe):
            if recipe not in made:
                made[recipe] = Pipeline("fixture", recipe, progress=progress)
            return made[recipe]
    if run is None:
        def run(recipe, stage, prompt):
            return pipeline(recipe).run_stage(stage, prompt, MAX_NEW_TOKENS)

    tok = pipeline("fp32").loaded.tokenizer
    runs = {}
    for prompt in GOLDEN_PROMPTS:
        for recipe, stage in chain(GOLDEN_RECIPES):
            runs[(recipe, stage, prompt)] = run(recipe, stage, prompt)
    prompts = {p: prompt_record(p, tok) for p in GOLDEN_PROMPTS}
    quantized = {r: quantize_record(pipeline(r).quantized) for r in QUANTIZED}
    qual = {}
    if with_quality:
        for recipe in QUANTIZED:
            progress(f"quantization quality of {recipe} (.pte against fp32, teacher-forced) ...")
            qual[recipe] = quality_record(_stateless(pipeline("fp32")), pipeline(recipe).pte_step())
    return Computed(runs, prompts, qual, quantized, tok, current_provenance())


def _stateless(fp32_pipeline):
    """The FP32 model's own forward (no cache) as a step function: the reference for quality."""
    model = fp32_pipeline.loaded.model
    return lambda ids, pos: model(input_ids=ids).logits


# ---- what changed -----------------------------------------------------------------------------
@dataclass
class Change:
    kind: str  # tokens, logits, prompt, quality, llamacpp, format, new, stale
    where: str  # prompt / recipe / stage, for people
    detail: str
    acceptable: bool
    why: str = ""

    def line(self) -> str:
        verdict = "numerics (acceptable)" if self.acceptable else f"BLOCKS the refresh: {self.why}"
        return f"- [{self.kind}] {self.where}: {self.detail} -> {verdict}"


@dataclass
class Assessment:
    changes: list[Change] = field(default_factory=list)
    recorded: dict = field(default_factory=dict)
    now: dict = field(default_factory=dict)

    @property
    def blockers(self) -> list[Change]:
        return [c for c in self.changes if not c.acceptable]


def _old(path: Path):
    return read_json_golden(path) if path.is_file() else None


def assess(c: Computed, llamacpp: bool = True) -> Assessment:
    multiple = tolerance("refresh/logit_multiple").atol
    out = Assessment(recorded=recorded_provenance(), now=c.provenance)
    tok = c.tokenizer
    for prompt in GOLDEN_PROMPTS:
        old_prompt = _old(prompt_golden_path(prompt))
        if old_prompt is None:
            out.changes.append(Change("new", repr(prompt), "no prompt golden yet", True))
        elif old_prompt != c.prompts[prompt]:
            out.changes.append(Change(
                "prompt", repr(prompt),
                f"chat template/tokenizer: rendered {old_prompt.get('rendered')!r} ids {old_prompt.get('ids')} -> "
                f"{c.prompts[prompt]['rendered']!r} ids {c.prompts[prompt]['ids']}", False,
                "what the model is fed changed (a template or tokenizer change is behaviour, not numerics)"))
        old_ids = {}
        for recipe, stage in chain(GOLDEN_RECIPES):
            rec = _old(token_golden_path(recipe, stage, prompt))
            old_ids[(recipe, stage)] = rec["ids"] if rec else None
        new_ids = {(r, s): c.runs[(r, s, prompt)].ids for r, s in chain(GOLDEN_RECIPES)}
        for recipe in sorted(GOLDEN_RECIPES, key=lambda r: (r != "fp32", r)):
            out.changes += _recipe_changes(c, prompt, recipe, old_ids, new_ids, multiple, tok)
    for recipe, record in c.quantized.items():
        out.changes += _quantize_changes(recipe, record)
    for recipe, record in c.quality.items():
        out.changes += _quality_changes(recipe, record)
    out.changes += _stale(c)
    if llamacpp:
        out.changes += _llamacpp(c)
    return out


def _recipe_changes(c, prompt, recipe, old_ids, new_ids, multiple, tok) -> list[Change]:
    changes = []
    first = None  # (stage, position) of the first stage whose ids differ from its golden
    lp_by_stage = {}
    blocking = []
    logit_blocking = []
    for stage in STAGES:
        node = (recipe, stage)
        gen = c.runs[(recipe, stage, prompt)]
        old = old_ids[node]
        if old is None:
            changes.append(Change("new", f"{prompt!r} {recipe}:{stage}", "no golden yet", True))
            continue
        pos = first_divergence(old, gen.ids)
        old_logits = _old(logit_golden_path(recipe, stage, prompt))
        if old_logits is not None and old_logits and "logits" not in old_logits[0]:
            changes.append(Change("format", f"{prompt!r} {recipe}:{stage}",
                                  "logit golden has no logit vectors (an older format)", False,
                                  "it cannot be compared; record the new format deliberately with --allow"))
        elif old_logits is not None:
            diff, tol = logit_golden_diff(recipe, stage, prompt, gen)
            lp_by_stage[stage] = diff.max_logprob
            if not diff.within(tol, multiple):
                logit_blocking.append(f"{stage}: {diff.describe(tol)}")
            elif not diff.within(tol) and pos is None:
                changes.append(Change("logits", f"{prompt!r} {recipe}:{stage}", diff.describe(tol), True))
        if pos is None:
            continue
        if first is None:
            first = (stage, pos)
        margin = margin_at(gen, pos)
        pred = predecessor(*node)
        follows = (pred is not None and old_ids.get(pred) is not None and old == old_ids[pred]
                   and gen.ids == new_ids[pred] and old_ids[pred] != new_ids[pred])
        if not follows and not is_near_tie(margin):
            blocking.append(f"{stage} at position {pos} with a top-2 margin of "
                            + (f"{margin:.3f}" if margin is not None else "(none)") + " (not a near-tie)")
    if first is not None:
        stage, pos = first
        gen = c.runs[(recipe, stage, prompt)]
        old = old_ids[(recipe, stage)]
        margin = margin_at(gen, pos)
        lps = ", ".join(f"{s} {v:.3g}" for s, v in lp_by_stage.items())
        detail = (f"first diverging stage {recipe}:{stage} at generated position {pos}: golden "
                  f"{_tok(tok, old[pos] if pos < len(old) else None)}, now "
                  f"{_tok(tok, gen.ids[pos] if pos < len(gen.ids) else None)}; top-2 margin there "
                  + (f"{margin:.3f}" if margin is not None else "(none)")
                  + f"; largest log-prob change per stage: {lps or '(none)'}")
        changes.append(Change("tokens", f"{prompt!r} {recipe}", detail, not blocking,
                              "a clear-margin change: " + "; ".join(blocking)))
    for text in logit_blocking:
        changes.append(Change("logits", f"{prompt!r} {recipe}", text, False,
                              f"beyond {multiple:g}x the golden's tolerance"))
    return changes


def _quality_changes(recipe: str, record: dict) -> list[Change]:
    if not quality_golden_path(recipe).is_file():
        return [Change("new", f"quality {recipe}", "no quality golden yet", True)]
    problem = check_quality_golden(recipe, record)
    return [] if problem is None else [Change("quality", recipe, problem, False, "quality beyond its budget")]


def _quantize_changes(recipe: str, record: dict) -> list[Change]:
    if not quantize_golden_path(recipe).is_file():
        return [Change("new", f"quantize {recipe}", "no quantize golden yet", True)]
    problem = check_quantize_golden(recipe, record)
    return [] if problem is None else [Change("quantize", recipe, problem, False,
                                              "torchao now makes other codes or scales from the same weights")]


def _stale(c: Computed) -> list[Change]:
    """Golden files this stack no longer computes (a prompt or recipe removed): the update drops them."""
    root = goldens_dir()
    wanted = {p.resolve() for p in c.files()}
    out = []
    for sub in ("tokens", "logits", "prompts", "quality", "quantize"):
        for path in sorted((root / sub).rglob("*.json")) if (root / sub).is_dir() else []:
            if path.resolve() not in wanted:
                out.append(Change("stale", str(path.relative_to(root)), "no longer recorded; the update removes it", True))
    return out


def _llamacpp(c: Computed) -> list[Change]:
    try:
        from harness.goldens.agreement import llamacpp_agreement

        problems = llamacpp_agreement({p: c.runs[("fp32", "hf_generate", p)] for p in GOLDEN_PROMPTS})
    except HarnessError as e:
        return [Change("llamacpp", "fp32", f"the independent check could not run: {e}", False,
                       "llama.cpp must agree with the new fp32 goldens")]
    return [Change("llamacpp", "fp32", p, False, "llama.cpp, an independent implementation, disagrees")
            for p in problems]


# ---- writing ----------------------------------------------------------------------------------
def new_provenance(a: Assessment, allow: str | None) -> dict:
    prov = {k: a.now[k] for k in STACK_KEYS}
    history = list(a.recorded.get("accepted_over_the_gate", []))
    if allow is not None and a.blockers:
        history.append({
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "reason": allow,
            "blocked": [b.line() for b in a.blockers],
            "recorded_stack": {k: a.recorded.get(k) for k in STACK_KEYS},
            "new_stack": {k: a.now.get(k) for k in STACK_KEYS},
        })
    prov["accepted_over_the_gate"] = history
    return prov


def write_goldens(c: Computed, provenance: dict) -> None:
    """The whole set, provenance included, built beside the goldens directory, each file read back
    and checked, then swapped in: a crash leaves the old set (or, between the two renames, the old
    set under ``.goldens-old``, which the next write puts back first)."""
    root = goldens_dir().resolve()
    stage_dir = root.parent / f".{root.name}-new.{os.getpid()}"
    old_dir = root.parent / f".{root.name}-old"
    if not root.exists() and old_dir.exists():
        old_dir.rename(root)
    shutil.rmtree(stage_dir, ignore_errors=True)
    files = {path.resolve().relative_to(root): data for path, data in c.files().items()}
    files[Path("provenance.json")] = provenance
    for rel, data in files.items():
        target = stage_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        blob = encode_json(data)
        with open(target, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        if target.read_bytes() != blob:
            shutil.rmtree(stage_dir, ignore_errors=True)
            raise HarnessError(f"golden {target} did not read back as written", "check the disk and retry")
    shutil.rmtree(old_dir, ignore_errors=True)
    if root.exists():
        root.rename(old_dir)
    stage_dir.rename(root)
    shutil.rmtree(old_dir, ignore_errors=True)


# ---- the two commands -------------------------------------------------------------------------
def print_provenance(a: Assessment, say=print) -> None:
    changed = provenance_diff(a.recorded, a.now)
    say("provenance (recorded -> now):")
    for key in STACK_KEYS:
        say(f"  {key}: {a.recorded.get(key)} -> {a.now.get(key)}" + ("  changed" if key in changed else ""))


def diff_main(computed: Computed | None = None, say=print, progress=print) -> int:
    recorded_provenance()  # a broken goldens directory is one line before minutes of work
    c = computed or compute(progress=progress)
    a = assess(c)
    print_provenance(a, say)
    real = a.changes
    if not real:
        say("\nno golden changed: every stage still says exactly what it said")
        return 0
    say(f"\n{len(real)} change(s) against the committed goldens:")
    for ch in real:
        say(ch.line())
    if a.blockers:
        say(f"\n{len(a.blockers)} of them block a refresh: report a clear-margin change upstream with this "
            f"output; `{UPDATE_COMMAND} --allow REASON` records them anyway, with the reason.")
    else:
        say(f"\nevery change is numerics: accept them with `{UPDATE_COMMAND}`.")
    return 1


def update_main(allow: str | None = None, computed: Computed | None = None, say=print, progress=print) -> int:
    if allow is not None and not allow.strip():
        raise HarnessError("--allow needs a reason", 'say why, e.g. --allow "torchao 0.19 rounds scales differently"')
    recorded_provenance()
    c = computed or compute(progress=progress)
    a = assess(c)
    print_provenance(a, say)
    for ch in a.changes:
        say(ch.line())
    if a.blockers and allow is None:
        say(f"\nnot updated: {len(a.blockers)} change(s) are not numerics (above); nothing was written. If they "
            f"are intended, `{UPDATE_COMMAND} --allow \"REASON\"` records them with the reason.")
        return 1
    write_goldens(c, new_provenance(a, allow))
    what = f"{len(a.changes)} change(s)" if a.changes else "no change"
    say(f"\ngoldens updated in {goldens_dir()} ({what}"
        + (f"; {len(a.blockers)} accepted over the gate: {allow!r}" if a.blockers else "") + ")")
    return 0
