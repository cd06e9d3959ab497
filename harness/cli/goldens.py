"""``harness goldens diff|update|matrix``: the commands, and the options that say whose goldens
they work on: --model, --goldens, --recipe, --prompts (docs/your-model.md)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.cli.guard import progress as _progress, verdict

SKIP_HELP = ("run even if the memory pre-flight estimates more than the memory available "
             "(also HARNESS_SKIP_MEMORY_CHECK=1)")


def golden_target_args(p, update: bool) -> None:
    """--model/--goldens/--prompts/--recipe: whose goldens, where (docs/your-model.md)."""
    p.add_argument("--model", default="fixture",
                   help="fixture (the harness's own, in goldens/), or your Gemma 4 checkpoint directory")
    p.add_argument("--goldens", metavar="DIR",
                   help="the goldens directory (default: the repository's goldens/, or HARNESS_GOLDENS_DIR); "
                        "commit it in your own repository")
    p.add_argument("--recipe", action="append", metavar="RECIPE",
                   help=("recipes to record (repeatable; default 8da4w-fast, or those already recorded)" if update
                         else "check that RECIPE's goldens are recorded (every recorded recipe is diffed)"))
    if update:
        p.add_argument("--prompts", metavar="FILE.jsonl",
                       help='your prompts, one {"prompt": "..."} per line (default: those recorded, else the '
                            "default set, one longer than the sliding window)")
    p.add_argument("--skip-memory-check", action="store_true", help=SKIP_HELP)


def golden_subject(args):
    """Point the goldens at --goldens, then resolve --model (with --prompts/--recipe)."""
    from harness.goldens.subject import subject_for

    if args.goldens:
        os.environ["HARNESS_GOLDENS_DIR"] = str(Path(args.goldens).resolve())
    if args.skip_memory_check:
        os.environ["HARNESS_SKIP_MEMORY_CHECK"] = "1"
    return subject_for(args.model, getattr(args, "prompts", None), args.recipe)


def _render_matrix(args) -> int:
    """--render RUN.json ...: one table from earlier matrix runs (no environment is made)."""
    import json

    from harness.errors import HarnessError
    from harness.goldens.matrix import render

    records = []
    for path in args.render:
        try:
            records.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as e:
            raise HarnessError(f"{path}: not a matrix JSON ({e})", "pass the .json a matrix run wrote beside its --out") from None
    text = render(records)
    if args.out is None:
        print(text)
    else:
        from harness.atomic import write_bytes_atomic

        write_bytes_atomic(args.out, text.encode())
    return 0


@verdict
def cmd_goldens_diff(args) -> int:
    """Exit 0: every golden stage says what it said; 1: something changed (one line per change); 2: an error."""
    from harness.goldens.refresh import diff_main

    subject = golden_subject(args)
    return diff_main(progress=_progress, subject=subject, recipes=args.recipe, report=args.json)


@verdict
def cmd_goldens_update(args) -> int:
    """The one way to rewrite goldens: recompute the whole set, write it only through the gate."""
    from harness.goldens.refresh import update_main

    return update_main(allow=args.allow, progress=_progress, subject=golden_subject(args))


def cmd_goldens_matrix(args) -> int:
    """One environment per release, ``goldens diff`` in each, a table (harness/goldens/matrix.py)."""
    from harness.goldens.matrix import DEFAULT_RELEASES, check_releases, default_root, matrix

    if args.render:
        return _render_matrix(args)
    releases = check_releases(args.releases or DEFAULT_RELEASES)
    diff_args = [*(["--model", args.model] if args.model != "fixture" else []),
                 *(["--goldens", str(Path(args.goldens).resolve())] if args.goldens else [])]
    if args.out is not None:
        from harness.atomic import check_writable

        if args.out.suffix == ".json":
            raise HarnessError(f"--out {args.out}: the table is markdown and its JSON goes beside it",
                               "name the table FILE.md")
        check_writable(args.out)
    pip_args = [a for link in args.find_links or () for a in ("--find-links", str(Path(link).resolve()))]
    pip_args += ["--no-index"] if args.no_index else []
    matrix(releases, args.out, args.envs or default_root(), pip_args, diff_args, say=print, no_deps=args.no_deps)
    return 0


def add_goldens_commands(sub) -> None:
    """The ``goldens`` group: diff, update, matrix."""
    gd = sub.add_parser("goldens", help="goldens: diff against the committed ones, or update them through the gate")
    gsub = gd.add_subparsers(dest="goldens_command", required=True)
    gdd = gsub.add_parser("diff", help="rerun every golden stage and show what changed, and the provenance "
                                       "(exit 0: nothing changed, 1: something did, 2: an error)")
    gdd.add_argument("--json", metavar="FILE", type=Path,
                     help="also write the verdict, each stage's move and the provenance changed as JSON")
    gdd.set_defaults(func=cmd_goldens_diff)
    gdu = gsub.add_parser("update", help="recompute every golden and rewrite them all, only if every change is "
                                         "numerics (near-ties, logits within bounds, llama.cpp agreeing); the "
                                         "first update of a checkpoint records")
    gdu.add_argument("--allow", metavar="REASON",
                     help="write even what the gate blocks; the reason, what was blocked, the date and both "
                          "stacks are appended to the model's provenance")
    gdu.set_defaults(func=cmd_goldens_update)
    for p in (gdd, gdu):
        golden_target_args(p, update=p is gdu)

    gm = gsub.add_parser("matrix", help="a compatibility matrix: one environment per release (pip requirement), "
                                        "goldens diff in each, a markdown table (and JSON beside it)")
    gm.add_argument("releases", nargs="*", metavar="RELEASE",
                    help="pip requirements, e.g. transformers==5.23.0 (default: the list in harness/goldens/matrix.py)")
    gm.add_argument("--out", type=Path, metavar="FILE.md", help="write the table there (and FILE.json)")
    gm.add_argument("--envs", type=Path, metavar="DIR", help="where the environments are cached "
                                                             "(default: the artifact cache's matrix/)")
    gm.add_argument("--find-links", action="append", metavar="DIR", help="local wheels for pip (repeatable)")
    gm.add_argument("--no-index", action="store_true", help="only --find-links, not the registry")
    gm.add_argument("--no-deps", action="store_true", help="install each release without its requirements "
                                                           "(e.g. transformers 5.25 without kernels)")
    gm.add_argument("--render", nargs="+", type=Path, metavar="RUN.json",
                    help="no runs: one table from the JSON of earlier runs (to --out, or stdout)")
    gm.add_argument("--model", default="fixture", help="fixture, or your checkpoint directory (with --goldens)")
    gm.add_argument("--goldens", metavar="DIR", help="the goldens directory of --model")
    gm.set_defaults(func=cmd_goldens_matrix)
