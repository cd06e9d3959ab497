"""``harness verify``: a .pte held to the committed goldens (the fixture), to a checkpoint's
recorded goldens (``--model DIR``, ``--goldens G``), or to transformers' generate (a directory with
none recorded)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.cli.guard import verdict
from harness.errors import HarnessError

DEFAULT_PROMPT = "What is the capital of France?"


@verdict
def cmd_verify(args) -> int:
    """Check a .pte against the committed goldens (fixture) or against HF generate (a directory)."""
    from harness.goldens.checks import check_tokens
    from harness.goldens.store import GOLDEN_PROMPTS, golden_ids
    from harness.runtimes.executorch import PteRuntime

    from harness.goldens.provenance import stack_note
    from harness.export.preflight import checked_pipeline

    from harness.cli.guard import check_pte_path

    runner = PteRuntime(check_pte_path(args.pte))
    meta = runner.metadata()
    missing = [m for m in ("get_eos_ids", "get_max_context_len", "get_vocab_size") if m not in meta]
    if missing:
        raise HarnessError(f"{args.pte} lacks the runner metadata method(s) {', '.join(missing)}",
                           "re-export it with: harness export")
    eos = meta["get_eos_ids"] if isinstance(meta["get_eos_ids"], list) else [meta["get_eos_ids"]]
    if args.model != "fixture" and (recorded := _recorded_model_goldens(args)):
        return _verify_model_goldens(runner, eos, args, *recorded)
    args.recipe = args.recipe or "8da4w"
    pipe = checked_pipeline(args.model, args.recipe, until="load", skip=args.skip_memory_check)
    failures = 0
    prompts = list(GOLDEN_PROMPTS) if args.model == "fixture" else [DEFAULT_PROMPT]
    label = "golden" if args.model == "fixture" else "HF generate"
    for prompt in prompts:
        gen = runner.generate(pipe.prompt_ids(prompt), 9, eos_ids=eos)
        if args.model == "fixture":
            from harness.recipes import golden_recipe  # 8da4w-fast is held to 8da4w's goldens

            want = golden_ids(golden_recipe(pipe.recipe.name), "pte", prompt)
        else:
            want = pipe.hf_generate(prompt)
        report = check_tokens(want, gen, pipe.loaded.tokenizer, args.pte)
        print(f"{'ok  ' if report is None else 'FAIL'} {prompt!r}: {pipe.decode(gen.ids)!r}"
              + ("" if report is None else f"\n     {report}"))
        failures += report is not None
    print(f"{len(prompts) - failures}/{len(prompts)} prompts equal the {label}")
    if failures and args.model == "fixture" and (note := stack_note()):
        print(note)
    return 1 if failures else 0


def _recorded_model_goldens(args):
    """(subject, recipe) where --model DIR has goldens recorded (in --goldens DIR), else None."""
    from harness.goldens.provenance import recorded_provenance
    from harness.goldens.subject import subject_for

    if args.goldens:
        os.environ["HARNESS_GOLDENS_DIR"] = str(Path(args.goldens).resolve())
    subject = subject_for(args.model)
    recorded = recorded_provenance(subject.key)
    if not recorded:
        if args.goldens:
            from harness.goldens.subject import recorded_subject_problem

            raise HarnessError(*recorded_subject_problem(subject))
        return None
    recipes = list(recorded.get("recipes", ()))
    recipe = args.recipe or (recipes[0] if len(recipes) == 1 else None)
    if recipe not in recipes:
        raise HarnessError(f"the goldens of {subject.key} were recorded for {', '.join(recipes)}"
                           + (f", not {recipe}" if recipe else ""), f"pass --recipe {recipes[0]} (the .pte's recipe)")
    return subject, recipe


def _verify_model_goldens(runner, eos, args, subject, recipe) -> int:
    """A .pte against a checkpoint's recorded goldens: each recorded prompt's ids (its prompt
    golden) through the .pte, held to the recipe's ``pte`` stage token golden."""
    from harness.goldens.checks import check_tokens
    from harness.goldens.store import golden_ids, prompt_golden_path, read_json_golden
    from harness.models.load import _load_tokenizer

    tokenizer = _load_tokenizer(Path(subject.spec))
    failures = 0
    for prompt in subject.prompts:
        ids = read_json_golden(prompt_golden_path(prompt, subject.key))["ids"]
        want = golden_ids(recipe, "pte", prompt, subject.key)
        gen = runner.generate(ids, len(want), eos_ids=eos)
        report = check_tokens(want, gen, tokenizer, args.pte)
        print(f"{'ok  ' if report is None else 'FAIL'} {prompt[:60]!r}: {tokenizer.decode(gen.ids)!r}"
              + ("" if report is None else f"\n     {report}"))
        failures += report is not None
    print(f"{len(subject.prompts) - failures}/{len(subject.prompts)} prompts equal the {recipe}:pte goldens of {subject.key}")
    return 1 if failures else 0
