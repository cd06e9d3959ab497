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
from pathlib import Path

from harness.errors import HarnessError
from harness.goldens.change import Assessment, Change
from harness.goldens.localized import activation_changes, localization_lines
from harness.goldens.checks import _tok, is_near_tie, logit_golden_diff, first_divergence, margin_at, quality, check_quantize_golden, check_quality_golden
from harness.goldens.provenance import current_provenance, provenance_diff, recorded_provenance, stack_keys
from harness.goldens.store import GOLDEN_PROMPTS, MAX_NEW_TOKENS, UPDATE_COMMAND, goldens_dir, logit_golden_path, prompt_golden_path, prompt_record, quality_golden_path, quantize_golden_path, quantize_record, read_json_golden, token_golden_path
from harness.goldens.subject import Subject, fixture_subject
from harness.goldens.write import SUBTREES, Computed, check_writable, recover, write_goldens
from harness.recipes import RECIPES
from harness.tolerances import tolerance

QUANTIZED = tuple(name for name, r in RECIPES.items() if r.linear is not None)


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


def compute(run=None, pipeline=None, progress=print, with_quality: bool = True, subject: Subject | None = None) -> Computed:
    """The whole golden set on this stack. ``run(recipe, stage, prompt)`` and ``pipeline(recipe)``
    default to fresh Pipelines (the tests pass their session's, so nothing is computed twice).
    A user's checkpoint (``subject``) goes through harness/goldens/checkpoint.py."""
    if subject is not None and not subject.is_fixture:
        from harness.goldens.checkpoint import compute_checkpoint

        return compute_checkpoint(subject, progress=progress)
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

    subject = fixture_subject()
    tok = pipeline("fp32").loaded.tokenizer
    runs = {}
    for prompt in GOLDEN_PROMPTS:
        for recipe, stage in subject.chain():
            runs[(recipe, stage, prompt)] = run(recipe, stage, prompt)
    prompts = {p: prompt_record(p, tok) for p in GOLDEN_PROMPTS}
    quantized = {r: quantize_record(pipeline(r).quantized) for r in QUANTIZED}
    from harness.goldens.activations import ACTIVATION_RECIPES, activation_goldens

    acts, localized = activation_goldens(
        lambda r: pipeline(r).quantized, {p: prompts[p]["ids"] for p in GOLDEN_PROMPTS},
        {(r, p): runs[(r, "eager", p)].ids for r in ACTIVATION_RECIPES for p in GOLDEN_PROMPTS})
    qual = {}
    if with_quality:
        for recipe in QUANTIZED:
            progress(f"quantization quality of {recipe} (.pte against fp32, teacher-forced) ...")
            qual[recipe] = quality_record(_stateless(pipeline("fp32")), pipeline(recipe).pte_step())
    return Computed(runs, prompts, qual, quantized, tok, current_provenance(), subject,
                    activations=acts, localized=localized)


def _stateless(fp32_pipeline):
    """The FP32 model's own forward (no cache) as a step function: the reference for quality."""
    model = fp32_pipeline.loaded.model
    return lambda ids, pos: model(input_ids=ids).logits


# ---- what changed -----------------------------------------------------------------------------
def _old(path: Path):
    return read_json_golden(path) if path.is_file() else None


def assess(c: Computed, llamacpp: bool = True) -> Assessment:
    multiple = tolerance("refresh/logit_multiple").atol
    subject = c.subject
    key = subject.key
    out = Assessment(recorded=recorded_provenance(key), now=c.provenance)
    tok = c.tokenizer
    nodes = subject.chain()
    for prompt in subject.prompts:
        old_prompt = _old(prompt_golden_path(prompt, key))
        if old_prompt is None:
            out.changes.append(Change("new", repr(prompt), "no prompt golden yet", True))
        elif old_prompt != c.prompts[prompt]:
            out.changes.append(Change(
                "prompt", repr(prompt),
                f"chat template/tokenizer: rendered {old_prompt.get('rendered')!r} ids {old_prompt.get('ids')} -> "
                f"{c.prompts[prompt]['rendered']!r} ids {c.prompts[prompt]['ids']}", False,
                "what the model is fed changed (a template or tokenizer change is behaviour, not numerics)"))
        old_ids = {}
        for recipe, stage in nodes:
            rec = _old(token_golden_path(recipe, stage, prompt, key))
            old_ids[(recipe, stage)] = rec["ids"] if rec else None
        new_ids = {(r, s): c.runs[(r, s, prompt)].ids for r, s in nodes}
        for recipe in subject.chain_recipes():
            out.changes += _recipe_changes(c, prompt, recipe, old_ids, new_ids, multiple, tok, out.moves)
    out.changes += activation_changes(c)
    for recipe, record in c.quantized.items():
        out.changes += _quantize_changes(recipe, record, key)
    for recipe, record in c.quality.items():
        out.changes += _quality_changes(recipe, record, key)
    out.changes += _stale(c)
    if llamacpp and subject.is_fixture:
        out.changes += _llamacpp(c)
    return out


def _recipe_changes(c, prompt, recipe, old_ids, new_ids, multiple, tok, moves=None) -> list[Change]:
    changes = []
    first = None  # (stage, position) of the first stage whose ids differ from its golden
    lp_by_stage = {}
    blocking = []
    logit_blocking = []
    subject, key = c.subject, c.subject.key
    for stage in subject.stages(recipe):
        node = (recipe, stage)
        gen = c.runs[(recipe, stage, prompt)]
        old = old_ids[node]
        if old is None:
            changes.append(Change("new", f"{prompt!r} {recipe}:{stage}", "no golden yet", True))
            continue
        pos = first_divergence(old, gen.ids)
        beyond = False  # the logits beyond the golden's tolerance
        old_logits = _old(logit_golden_path(recipe, stage, prompt, key))
        if old_logits is not None and old_logits and not ({"logits", "sketch"} & set(old_logits[0])):
            changes.append(Change("format", f"{prompt!r} {recipe}:{stage}",
                                  "logit golden has no logit vectors (an older format)", False,
                                  "it cannot be compared; record the new format deliberately with --allow"))
        elif old_logits is not None:
            diff, tol = logit_golden_diff(recipe, stage, prompt, gen, model=key)
            lp_by_stage[stage] = diff.max_logprob
            beyond = not diff.within(tol)
            if not diff.within(tol, multiple):
                logit_blocking.append(f"{stage}: {diff.describe(tol)}")
            elif not diff.within(tol) and pos is None:
                changes.append(Change("logits", f"{prompt!r} {recipe}:{stage}", diff.describe(tol), True))
        if moves is not None:
            m = moves.setdefault(f"{recipe}:{stage}", {"prompts": 0, "ids_changed": 0, "max_logprob": None,
                                                       "moved_prompts": []})
            m["prompts"] += 1
            m["ids_changed"] += pos is not None
            if pos is not None or beyond:
                m["moved_prompts"].append(prompt)  # its ids, or its logits beyond the golden's tolerance
            if stage in lp_by_stage:
                m["max_logprob"] = max(m["max_logprob"] or 0.0, float(lp_by_stage[stage]))
        if pos is None:
            continue
        if first is None:
            first = (stage, pos)
        margin = margin_at(gen, pos)
        pred = subject.predecessor(*node)
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


def _quality_changes(recipe: str, record: dict, key: str = "fixture") -> list[Change]:
    if not quality_golden_path(recipe, key).is_file():
        return [Change("new", f"quality {recipe}", "no quality golden yet", True)]
    problem = check_quality_golden(recipe, record, key)
    return [] if problem is None else [Change("quality", recipe, problem, False, "quality beyond its budget")]


def _quantize_changes(recipe: str, record: dict, key: str = "fixture") -> list[Change]:
    if not quantize_golden_path(recipe, key).is_file():
        return [Change("new", f"quantize {recipe}", "no quantize golden yet", True)]
    problem = check_quantize_golden(recipe, record, key)
    return [] if problem is None else [Change("quantize", recipe, problem, False,
                                              "torchao now makes other codes or scales from the same weights")]


def _stale(c: Computed) -> list[Change]:
    """Golden files of this model that this stack no longer computes (a prompt or recipe removed):
    the update drops them. Other models' goldens are not this run's business."""
    root = goldens_dir()
    wanted = {p.resolve() for p in c.files()}
    out = []
    for sub in SUBTREES:
        where = root / sub / c.subject.key
        for path in sorted(where.rglob("*.json")) if where.is_dir() else []:
            if path.resolve() not in wanted:
                out.append(Change("stale", str(path.relative_to(root)), "no longer recorded; the update removes it", True))
    return out


def _llamacpp(c: Computed) -> list[Change]:
    try:
        from harness.goldens.agreement import llamacpp_agreement

        problems = llamacpp_agreement({p: c.runs[("fp32", "hf_generate", p)] for p in c.subject.prompts})
    except HarnessError as e:
        return [Change("llamacpp", "fp32", f"the independent check could not run: {e}", False,
                       "llama.cpp must agree with the new fp32 goldens")]
    return [Change("llamacpp", "fp32", p, False, "llama.cpp, an independent implementation, disagrees")
            for p in problems]


# ---- writing ----------------------------------------------------------------------------------
def new_provenance(a: Assessment, allow: str | None, subject: Subject | None = None, extra: dict | None = None) -> dict:
    """The stack now and the gate's record; for a checkpoint also what the goldens are of (its id,
    directory, prompts, recipes, stage chain, how long each stage took)."""
    key = subject.key if subject is not None else "fixture"
    keys = stack_keys(key)
    prov = {k: a.now[k] for k in keys}
    history = list(a.recorded.get("accepted_over_the_gate", []))
    if allow is not None and a.blockers:
        history.append({
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "reason": allow,
            "blocked": [b.line() for b in a.blockers],
            "recorded_stack": {k: a.recorded.get(k) for k in keys},
            "new_stack": {k: a.now.get(k) for k in keys},
        })
    prov["accepted_over_the_gate"] = history
    if subject is not None and not subject.is_fixture:
        prov.update({"model_directory": subject.spec, "prompts": list(subject.prompts),
                     "recipes": list(subject.recipes), "stages": [f"{r}:{s}" for r, s in subject.chain()],
                     "synthetic_weights": subject.synthetic, "max_context": subject.max_context,
                     **(extra or {})})
    return prov


# ---- the two commands -------------------------------------------------------------------------
def print_provenance(a: Assessment, say=print, model: str = "fixture") -> None:
    changed = provenance_diff(a.recorded, a.now, model)
    say("provenance (recorded -> now):")
    for key in stack_keys(model):
        say(f"  {key}: {a.recorded.get(key)} -> {a.now.get(key)}" + ("  changed" if key in changed else ""))


def print_stage_stats(c: Computed, say=print) -> None:
    if c.stage_stats:
        say("stages (seconds, peak RSS):")
        for name, row in c.stage_stats.items():
            say(f"  {name}: {row['seconds']:.1f} s, peak RSS {row['peak_rss_gib']:.2f} GiB")


def _prepare(subject: Subject | None, for_update: bool) -> Subject:
    """The one-line checks before minutes of work: a readable goldens directory (and a writable
    one for an update), and, for ``diff``, goldens recorded for this very checkpoint."""
    from harness.goldens.subject import recorded_subject_problem

    subject = subject or fixture_subject()
    root = goldens_dir()
    if for_update:
        check_writable(root)
        recover(root)
    recorded_provenance(subject.key)
    if not for_update and (problem := recorded_subject_problem(subject)):
        raise HarnessError(*problem)
    return subject


def diff_summary(c: Computed, a: Assessment, rc: int) -> dict:
    """What ``goldens diff --json`` writes: the verdict, each stage's move, the provenance changed
    (the compatibility matrix's row, harness/goldens/matrix.py)."""
    return {"exit": rc, "model": c.subject.key, "changes": len(a.changes), "blockers": len(a.blockers),
            "blocking": [ch.line() for ch in a.blockers], "stages": a.moves, "stage_stats": c.stage_stats,
            "localized": localization_lines(c) + a.pte_localized,
            "provenance_changed": {k: list(v) for k, v in provenance_diff(a.recorded, a.now, c.subject.key).items()}}


def diff_main(computed: Computed | None = None, say=print, progress=print, subject: Subject | None = None,
              recipes=None, report: Path | None = None) -> int:
    """Print what changed; exit 0 (nothing), 1 (something). ``report``: the summary as JSON too."""
    import json

    from harness.atomic import write_bytes_atomic

    c, a, rc = _diff(computed, say, progress, subject, recipes)
    if report is not None:
        write_bytes_atomic(Path(report), json.dumps(diff_summary(c, a, rc), indent=1).encode(),  # the chain's order
                           verify=lambda p: json.loads(p.read_text()))
    return rc


def _diff(computed, say, progress, subject, recipes):
    from harness.goldens.pte_gap import pte_localization_lines
    from harness.goldens.subject import recorded_subject_problem

    subject = computed.subject if computed is not None else subject
    subject = _prepare(subject, for_update=False)
    if recipes and (problem := recorded_subject_problem(subject, recipes)):
        raise HarnessError(*problem)
    c = computed or compute(progress=progress, subject=subject)
    a = assess(c)
    print_provenance(a, say, subject.key)
    print_stage_stats(c, say)
    for line in localization_lines(c):
        say(f"localized: {line}")
    a.pte_localized = pte_localization_lines(subject, a.moves, progress)
    for line in a.pte_localized:
        say(f"localized: {line}")
    real = a.changes
    update = UPDATE_COMMAND + ("" if subject.is_fixture else f" --model {subject.spec} --goldens {goldens_dir()}")
    if not real:
        say(f"\nno golden changed: every stage of {subject.describe()} still says exactly what it said")
        return c, a, 0
    say(f"\n{len(real)} change(s) against the recorded goldens of {subject.describe()}:")
    for ch in real:
        say(ch.line())
    if a.blockers:
        say(f"\n{len(a.blockers)} of them block a refresh: report a clear-margin change upstream with this "
            f"output; `{update} --allow REASON` records them anyway, with the reason.")
    else:
        say(f"\nevery change is numerics: accept them with `{update}`.")
    return c, a, 1


def update_main(allow: str | None = None, computed: Computed | None = None, say=print, progress=print,
                subject: Subject | None = None) -> int:
    if allow is not None and not allow.strip():
        raise HarnessError("--allow needs a reason", 'say why, e.g. --allow "torchao 0.19 rounds scales differently"')
    subject = computed.subject if computed is not None else subject
    subject = _prepare(subject, for_update=True)
    first = not subject.is_fixture and not recorded_provenance(subject.key)
    c = computed or compute(progress=progress, subject=subject)
    a = assess(c)
    print_provenance(a, say, subject.key)
    print_stage_stats(c, say)
    if first:
        say(f"first record for {subject.describe()}: nothing to diff yet "
            f"({len(subject.prompts)} prompt(s), stages {' -> '.join(f'{r}:{s}' for r, s in subject.chain())})")
    else:
        for ch in a.changes:
            say(ch.line())
    if a.blockers and allow is None:
        say(f"\nnot updated: {len(a.blockers)} change(s) are not numerics (above); nothing was written. If they "
            f"are intended, `{UPDATE_COMMAND} --allow \"REASON\"` records them with the reason.")
        return 1
    write_goldens(c, new_provenance(a, allow, subject, {"stage_stats": c.stage_stats} if c.stage_stats else None))
    what = "first record" if first else (f"{len(a.changes)} change(s)" if a.changes else "no change")
    say(f"\ngoldens of {subject.describe()} updated in {goldens_dir()} ({what}"
        + (f"; {len(a.blockers)} accepted over the gate: {allow!r}" if a.blockers else "") + ")")
    return 0
